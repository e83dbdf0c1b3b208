/* A weighted mixture of training token files: data.train's list, the step's plan over
 * the sources, each source's own data loader, the state a checkpoint keeps
 * (data_mix.h). */
#include "src/data/data_mix.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/numbers.h"
#include "src/base/rng.h"

/* Domain separator of the sources' data orders: source i's seed is a hash of train.seed,
 * this and i, so no two sources share an order (part of the on-disk contract, as
 * data_loader.c's key). */
#define DATA_MIX_DOMAIN 0x6d6978736f757263ull /* "mixsourc" */

/* [*b, *e) without the spaces around it */
static void trim(const char **b, const char **e) {
    while (*b < *e && isspace((unsigned char)**b)) (*b)++;
    while (*e > *b && isspace((unsigned char)(*e)[-1])) (*e)--;
}

int data_mix_parse(const char *text, data_mix_list *out, char *why, size_t whylen) {
    memset(out, 0, sizeof *out);
    int weighted = 0;
    const char *p = text;
    for (;;) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *b = p, *e = end;
        trim(&b, &e);
        if (b == e) {
            snprintf(why, whylen, "entry %d of '%.200s' is empty (entries are PATH:WEIGHT "
                     "separated by ',')", out->n + 1, text);
            return -1;
        }
        if (out->n == DATA_MIX_MAX) {
            snprintf(why, whylen, "more than %d files in the mixture", DATA_MIX_MAX);
            return -1;
        }
        data_mix_entry *x = &out->e[out->n];
        const char *colon = NULL;
        for (const char *q = b; q < e; q++)
            if (*q == ':') colon = q;
        const char *path_end = e;
        if (colon && (size_t)(e - colon - 1) < sizeof x->weight_text) {
            char w[sizeof x->weight_text];
            snprintf(w, sizeof w, "%.*s", (int)(e - colon - 1), colon + 1);
            double v;
            const num_result r = num_parse_double(w, &v);
            if (r == NUM_RANGE || (r == NUM_OK && !(v > 0))) {
                snprintf(why, whylen, "weight %s of %.*s: must be a number more than 0", w,
                         (int)(colon - b > 400 ? 400 : colon - b), b);
                return -1;
            }
            if (r == NUM_OK) {
                memcpy(x->weight_text, w, sizeof w);
                x->weight = v;
                path_end = colon;
                weighted++;
            }
        }
        if (path_end == b) {
            snprintf(why, whylen, "entry %d of '%.200s' has a weight but no path", out->n + 1,
                     text);
            return -1;
        }
        if ((size_t)(path_end - b) >= sizeof x->path) {
            snprintf(why, whylen, "entry %d: path longer than %zu characters", out->n + 1,
                     sizeof x->path - 1);
            return -1;
        }
        snprintf(x->path, sizeof x->path, "%.*s", (int)(path_end - b), b);
        for (int i = 0; i < out->n; i++)
            if (strcmp(out->e[i].path, x->path) == 0) {
                snprintf(why, whylen, "%.400s is listed twice (give it one weight)", x->path);
                return -1;
            }
        out->n++;
        if (!*end) break;
        p = end + 1;
    }
    if (out->n > 1 && weighted < out->n) {
        for (int i = 0; i < out->n; i++)
            if (!out->e[i].weight_text[0]) {
                snprintf(why, whylen, "%.400s has no weight: each file of a mixture takes one "
                         "(PATH:WEIGHT; ',' separates the files, so a path cannot hold one)",
                         out->e[i].path);
                return -1;
            }
    }
    double sum = 0;
    for (int i = 0; i < out->n; i++) sum += out->n > 1 ? out->e[i].weight : 0;
    for (int i = 0; i < out->n; i++) out->e[i].weight = out->n > 1 ? out->e[i].weight / sum : 1;
    return 0;
}

/* Whether the text after path's last ':' reads as a weight (the path alone would not
 * parse back to itself). */
static int ends_in_weight(const char *path) {
    const char *colon = strrchr(path, ':');
    double v;
    return colon && num_parse_double(colon + 1, &v) != NUM_SYNTAX;
}

int data_mix_format(const data_mix_list *l, char *out, size_t outlen) {
    size_t len = 0;
    for (int i = 0; i < l->n; i++) {
        const data_mix_entry *x = &l->e[i];
        if (strchr(x->path, ',')) return -1;
        int k = l->n > 1 ? snprintf(out + len, outlen - len, "%s%s:%s", i ? ", " : "", x->path,
                                    x->weight_text)
                         : snprintf(out + len, outlen - len, "%s%s", x->path,
                                    ends_in_weight(x->path) ? ":1" : "");
        if (k < 0 || (size_t)k >= outlen - len) return -1;
        len += (size_t)k;
    }
    return (int)len;
}

int data_mix_init(data_mix *m, const token_file *const *tfs, const double *weights, int n,
                  int seq_len, int shuffle, uint64_t seed, int rank, int world, int micro_batch,
                  int doc_mask, const data_mix_saved *saved, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (n < 1 || n > DATA_MIX_MAX) {
        snprintf(err, errlen, "data mixture: %d sources, must be 1 to %d", n, DATA_MIX_MAX);
        return -1;
    }
    m->n = n;
    m->rank = rank;
    m->world = world;
    m->micro_batch = micro_batch;
    m->seq_len = seq_len;
    for (int i = 0; i < n; i++) {
        data_mix_source *s = &m->src[i];
        /* one file: the job's own loader, this rank's rows of global samples; several:
         * each source's loader only maps its k-th sample to a window and reads it */
        const int rc = n == 1 ? data_loader_init(&s->dl, tfs[i], seq_len, shuffle, seed, rank,
                                                 world, micro_batch, err, errlen)
                              : data_loader_init(&s->dl, tfs[i], seq_len, shuffle,
                                                 rng_hash64(rng_hash64(seed ^ DATA_MIX_DOMAIN) +
                                                            (uint64_t)i),
                                                 0, 1, 1, err, errlen);
        if (rc != 0) {
            data_mix_free(m);
            return -1;
        }
        s->dl.doc_mask = doc_mask;
        s->weight = weights[i];
        if (saved) {
            s->drawn = saved[i].drawn;
            s->sched = saved[i].sched;
        }
        s->drawn_at_open = s->drawn;
    }
    return 0;
}

void data_mix_free(data_mix *m) {
    for (int i = 0; i < m->n; i++) data_loader_free(&m->src[i].dl);
    free(m->plan_src);
    free(m->plan_window);
    m->plan_src = NULL;
    m->plan_window = NULL;
    m->planned = 0;
}

/* The source of the next sample: the largest deficit (n+1)·w - c, the first on ties. */
static int next_source(const data_mix *m) {
    uint64_t n = 0;
    for (int i = 0; i < m->n; i++) n += m->src[i].sched;
    int best = 0;
    double best_d = 0;
    for (int i = 0; i < m->n; i++) {
        const double d = (double)(n + 1) * m->src[i].weight - (double)m->src[i].sched;
        if (i == 0 || d > best_d) best = i, best_d = d;
    }
    return best;
}

int data_mix_step(data_mix *m, uint64_t step_start, int global_batch, int64_t *targets,
                  char *err, size_t errlen) {
    const uint64_t G = (uint64_t)global_batch;
    m->step_start = step_start;
    if (m->n == 1) {
        m->planned = global_batch;
        return data_loader_count_targets(&m->src[0].dl, step_start, G, targets, err, errlen);
    }
    if (m->planned != global_batch) {
        free(m->plan_src);
        free(m->plan_window);
        m->plan_src = malloc(G);
        m->plan_window = malloc(G * sizeof *m->plan_window);
        if (!m->plan_src || !m->plan_window) {
            snprintf(err, errlen, "data mixture: out of memory for a step of %d samples",
                     global_batch);
            m->planned = 0;
            return -1;
        }
        m->planned = global_batch;
    }
    int64_t total = 0;
    for (uint64_t j = 0; j < G; j++) {
        const int i = next_source(m);
        data_mix_source *s = &m->src[i];
        m->plan_src[j] = (uint8_t)i;
        m->plan_window[j] = data_loader_window(&s->dl, s->drawn);
        s->drawn++;
        s->sched++;
        int64_t k;
        if (data_loader_window_targets(&s->dl, m->plan_window[j], &k, err, errlen) != 0)
            return -1;
        total += k;
    }
    *targets = total;
    return 0;
}

/* The place in the planned step of row b of micro-batch mb of this rank (data_loader.h's
 * order, one file or a mixture). */
static uint64_t step_row(const data_mix *m, int mb, int b) {
    return ((uint64_t)mb * m->micro_batch + b) * (uint64_t)m->world + m->rank;
}

uint64_t data_mix_sample(const data_mix *m, int mb, int b) {
    return m->step_start + step_row(m, mb, b);
}

int data_mix_batch(data_mix *m, int mb, int32_t *inputs, int32_t *targets, int32_t *doc_start,
                   char *err, size_t errlen) {
    if (m->n == 1)
        return data_loader_batch(&m->src[0].dl, m->step_start, mb, inputs, targets, doc_start,
                                 err, errlen);
    const int T = m->seq_len, doc_mask = m->src[0].dl.doc_mask;
    const size_t n = (size_t)m->micro_batch * T;
    for (int i = 0; i < m->n; i++)
        if (token_file_check(m->src[i].dl.tf, err, errlen) != 0) goto fail;
    for (int b = 0; b < m->micro_batch; b++) {
        const uint64_t j = step_row(m, mb, b);
        const size_t row = (size_t)b * T;
        if (data_loader_read_row(&m->src[m->plan_src[j]].dl, m->plan_window[j], inputs + row,
                                 targets + row, doc_mask ? doc_start + row : NULL, err,
                                 errlen) != 0)
            goto fail;
    }
    return 0;
fail:
    memset(inputs, 0, n * sizeof *inputs);
    memset(targets, 0, n * sizeof *targets);
    if (doc_mask) memset(doc_start, 0, n * sizeof *doc_start);
    return -1;
}

int data_mix_saved_text(const data_mix_saved *saved, int n, char *out, size_t outlen) {
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        const data_mix_saved *s = &saved[i];
        int k = snprintf(out + len, outlen - len, "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
                         " %.17g %s\n", s->drawn, s->sched, s->bytes, s->fingerprint, s->weight,
                         s->path);
        if (k < 0 || (size_t)k >= outlen - len) return -1;
        len += (size_t)k;
    }
    return 0;
}

int data_mix_state_text(const data_mix *m, const data_mix_list *l, char *out, size_t outlen) {
    out[0] = '\0';
    if (m->n == 1) return 0;
    data_mix_saved *saved = calloc((size_t)m->n, sizeof *saved);
    if (!saved) return -1;
    for (int i = 0; i < m->n; i++) {
        const data_mix_source *s = &m->src[i];
        saved[i] = (data_mix_saved){s->drawn, s->sched, s->dl.tf->size, s->dl.tf->fingerprint,
                                    s->weight, ""};
        snprintf(saved[i].path, sizeof saved[i].path, "%s", l->e[i].path);
    }
    const int rc = data_mix_saved_text(saved, m->n, out, outlen);
    free(saved);
    return rc;
}

int data_mix_state_parse(const char *text, data_mix_saved *saved, int *n, char *why,
                         size_t whylen) {
    *n = 0;
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        if (!nl || *n == DATA_MIX_MAX) {
            snprintf(why, whylen, "%s", !nl ? "a line without its end" : "too many sources");
            return -1;
        }
        data_mix_saved *s = &saved[*n];
        char line[DATA_MIX_PATH + 128];
        snprintf(line, sizeof line, "%.*s", (int)(nl - p), p);
        int used = 0;
        unsigned long long d, c, b, f;
        if (sscanf(line, "%llu %llu %llu %llu %lf %n", &d, &c, &b, &f, &s->weight, &used) != 5 ||
            !line[used] || !(s->weight > 0 && s->weight <= 1) || c > d) {
            snprintf(why, whylen, "source %d's line '%.200s' is not \"DRAWN SCHED BYTES "
                     "FINGERPRINT WEIGHT PATH\"", *n + 1, line);
            return -1;
        }
        s->drawn = d, s->sched = c, s->bytes = b, s->fingerprint = f;
        snprintf(s->path, sizeof s->path, "%s", line + used);
        (*n)++;
        p = nl + 1;
    }
    return 0;
}

long long data_mix_tokens(const data_mix *m, int i) {
    return (long long)m->src[i].drawn * m->seq_len;
}

void data_mix_print_summary(const data_mix *m, const data_mix_list *l, FILE *out) {
    if (m->n == 1) return;
    uint64_t run = 0;
    for (int i = 0; i < m->n; i++) run += m->src[i].drawn - m->src[i].drawn_at_open;
    fprintf(out, "data mixture (this run: %llu windows):\n", (unsigned long long)run);
    for (int i = 0; i < m->n; i++) {
        const data_mix_source *s = &m->src[i];
        const uint64_t took = s->drawn - s->drawn_at_open;
        fprintf(out, "  %-32s share %6.2f%% (weight %6.2f%%), %lld tokens, %.3f epochs\n",
                l->e[i].path, run ? 100.0 * (double)took / (double)run : 0.0, 100 * s->weight,
                data_mix_tokens(m, i), (double)s->drawn / (double)s->dl.n_windows);
    }
}
