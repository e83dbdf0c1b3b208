/* The op table of the simulated compute backend: measured op times read from
 * bench_kernels' output (or perf_model --measure-ops', written in the same format), and
 * the cost of a call at any shape from them. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/sim/sim.h"

/* Shape dimensions, per op (d[0..5]):
 *   embedding_fwd/bwd   N C V          rmsnorm_fwd/bwd   N C
 *   matmul_fwd          N C OC res     matmul_bwd        N C OC parts (1 dinp | 2 dweight)
 *   rope                N heads hd     attention_fwd/bwd B T nh nkv hd rope (bwd: 1 = +rope)
 *   swiglu_fwd/bwd      N F            xent_fwd_bwd      N V
 *   bias_add/grad       N C
 *   copy, zero          bytes          every other op    n (elements) */
static const char *const names[SIM_N_OPS] = {
    "embedding_fwd", "embedding_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "matmul_fwd", "matmul_bwd",
    "rope", "attention_fwd", "attention_bwd", "swiglu_fwd", "swiglu_bwd", "xent_fwd_bwd",
    "f32_to_act", "adamw", "sum_squares", "accumulate", "copy", "zero", "round_to_bf16",
    "f32_to_bf16", "bf16_to_f32", "bias_add", "bias_grad"};

const char *sim_op_name(sim_op op) { return (unsigned)op < SIM_N_OPS ? names[op] : "?"; }

double sim_shape_work(const sim_shape *s) {
    const long *d = s->d;
    switch (s->op) {
    case SIM_MATMUL_FWD: return 2.0 * d[0] * d[1] * d[2];
    case SIM_MATMUL_BWD: return 2.0 * d[0] * d[1] * d[2] * (((d[3] & 1) != 0) + ((d[3] & 2) != 0));
    case SIM_ATTENTION_FWD:
    case SIM_ATTENTION_BWD: /* causal pairs x head width */
        return (double)d[0] * d[2] * ((double)d[1] * (d[1] + 1) / 2) * d[4];
    case SIM_ROPE: return (double)d[0] * d[1] * d[2];
    case SIM_EMBEDDING_FWD: case SIM_EMBEDDING_BWD: case SIM_RMSNORM_FWD: case SIM_RMSNORM_BWD:
    case SIM_SWIGLU_FWD: case SIM_SWIGLU_BWD: case SIM_XENT:
    case SIM_BIAS_ADD: case SIM_BIAS_GRAD:
        return (double)d[0] * d[1];
    default: return (double)d[0];
    }
}

/* Bytes a memory-bound op moves (for ops the table has no entry of), or 0 when the op's
 * cost cannot be derived from a bandwidth. */
static double shape_bytes(const sim_shape *s) {
    const double n = (double)s->d[0];
    switch (s->op) {
    case SIM_COPY: return 2 * n;
    case SIM_ZERO: return n;
    case SIM_ROUND_TO_BF16: return 8 * n;
    case SIM_F32_TO_BF16: case SIM_BF16_TO_F32: case SIM_F32_TO_ACT: return 6 * n;
    case SIM_ACCUMULATE: return 12 * n;
    case SIM_SUM_SQUARES: return 4 * n;
    case SIM_ADAMW: return 28 * n;
    case SIM_BIAS_ADD: return 4 * n * s->d[1];  /* bf16 x read and written (the bias: cached) */
    case SIM_BIAS_GRAD: return 2 * n * s->d[1]; /* bf16 dout read */
    default: return 0;
    }
}

void sim_shape_format(const sim_shape *s, char *out, size_t len) {
    const long *d = s->d;
    switch (s->op) {
    case SIM_EMBEDDING_FWD: case SIM_EMBEDDING_BWD:
        snprintf(out, len, "N=%ld C=%ld V=%ld", d[0], d[1], d[2]); break;
    case SIM_RMSNORM_FWD: case SIM_RMSNORM_BWD: case SIM_BIAS_ADD: case SIM_BIAS_GRAD:
        snprintf(out, len, "N=%ld C=%ld", d[0], d[1]);
        break;
    case SIM_MATMUL_FWD: snprintf(out, len, "%ldx%ldx%ld%s", d[0], d[1], d[2], d[3] ? " +res" : ""); break;
    case SIM_MATMUL_BWD: snprintf(out, len, "%ldx%ldx%ld parts=%ld", d[0], d[1], d[2], d[3]); break;
    case SIM_ROPE: snprintf(out, len, "N=%ld heads=%ld hd=%ld", d[0], d[1], d[2]); break;
    case SIM_ATTENTION_FWD: case SIM_ATTENTION_BWD:
        snprintf(out, len, "B=%ld T=%ld nh=%ld nkv=%ld hd=%ld%s", d[0], d[1], d[2], d[3], d[4],
                 s->op == SIM_ATTENTION_BWD && d[5] ? " rope" : "");
        break;
    case SIM_SWIGLU_FWD: case SIM_SWIGLU_BWD: snprintf(out, len, "N=%ld F=%ld", d[0], d[1]); break;
    case SIM_XENT: snprintf(out, len, "N=%ld V=%ld", d[0], d[1]); break;
    case SIM_COPY: case SIM_ZERO: snprintf(out, len, "bytes=%ld", d[0]); break;
    default: snprintf(out, len, "n=%ld", d[0]); break;
    }
}

/* The value after "key=" in text, or dflt. */
static long key_value(const char *text, const char *key, long dflt) {
    size_t k = strlen(key);
    for (const char *p = text; (p = strstr(p, key)) != NULL; p++) {
        if ((p == text || isspace((unsigned char)p[-1])) && p[k] == '=')
            return strtol(p + k + 1, NULL, 10);
    }
    return dflt;
}

/* Parses one row's op name and shape text; returns 0, 1 for a row to skip (a variant the
 * model does not run), -1 when the op is not one of the table's. */
static int parse_shape(const char *op, const char *text, sim_shape *s) {
    memset(s, 0, sizeof *s);
    int rope = 0;
    char base[48];
    snprintf(base, sizeof base, "%s", op);
    char *plus = strstr(base, "+rope");
    if (plus) *plus = 0, rope = 1;
    int k = 0;
    while (k < SIM_N_OPS && strcmp(names[k], base) != 0) k++;
    if (k == SIM_N_OPS) return -1;
    s->op = (sim_op)k;
    if (strstr(text, "doc=")) return 1; /* document masks: the model runs the causal one */
    long *d = s->d;
    switch (s->op) {
    case SIM_MATMUL_FWD: case SIM_MATMUL_BWD: {
        const char *p = text;
        while (*p && !(isdigit((unsigned char)p[0]) && strchr(p, 'x'))) p++;
        if (sscanf(p, "%ldx%ldx%ld", &d[0], &d[1], &d[2]) != 3) return -1;
        d[3] = s->op == SIM_MATMUL_FWD ? strstr(text, "+res") != NULL : key_value(text, "parts", 3);
        break;
    }
    case SIM_ATTENTION_FWD: case SIM_ATTENTION_BWD:
        d[0] = key_value(text, "B", 0), d[1] = key_value(text, "T", 0);
        d[2] = key_value(text, "nh", 0), d[3] = key_value(text, "nkv", d[2]);
        d[4] = key_value(text, "hd", 0);
        d[5] = rope || strstr(text, " rope") != NULL;
        break;
    case SIM_ROPE:
        d[0] = key_value(text, "N", 0), d[1] = key_value(text, "heads", 0), d[2] = key_value(text, "hd", 0);
        break;
    case SIM_EMBEDDING_FWD: case SIM_EMBEDDING_BWD:
        d[0] = key_value(text, "N", 0), d[1] = key_value(text, "C", 0), d[2] = key_value(text, "V", 0);
        break;
    case SIM_RMSNORM_FWD: case SIM_RMSNORM_BWD: case SIM_BIAS_ADD: case SIM_BIAS_GRAD:
        d[0] = key_value(text, "N", 0), d[1] = key_value(text, "C", 0);
        break;
    case SIM_SWIGLU_FWD: case SIM_SWIGLU_BWD:
        d[0] = key_value(text, "N", 0), d[1] = key_value(text, "F", 0);
        break;
    case SIM_XENT: d[0] = key_value(text, "N", 0), d[1] = key_value(text, "V", 0); break;
    case SIM_COPY: case SIM_ZERO: d[0] = key_value(text, "bytes", 0); break;
    default: d[0] = key_value(text, "n", 0); break;
    }
    return sim_shape_work(s) > 0 ? 0 : -1;
}

static void add_entry(sim_op_table *t, const sim_shape *s, double us) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        sim_table_entry *e = realloc(t->e, (size_t)t->cap * sizeof *e);
        if (!e) {
            fprintf(stderr, "perf_model: error: out of memory reading the op table\n");
            exit(1);
        }
        t->e = e;
    }
    t->e[t->n++] = (sim_table_entry){*s, us};
}

int sim_table_load(sim_op_table *t, const char *path, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    snprintf(t->source, sizeof t->source, "%s", path);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot read the op table %s", path);
        return -1;
    }
    char line[512];
    int lineno = 0;
    double accumulate_gbs = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] != ' ') continue; /* rows start with two spaces; comments with '#' */
        /* the last five columns: time(us) TFLOP/s GB/s %ceiling #wrong */
        char *tok[64];
        int n = 0;
        for (char *save = NULL, *p = strtok_r(line, " \t\r\n", &save); p && n < 64;
             p = strtok_r(NULL, " \t\r\n", &save))
            tok[n++] = p;
        if (n < 7) continue;
        double us = atof(tok[n - 5]), gbs = atof(tok[n - 3]);
        if (atoi(tok[n - 1]) != 0) {
            snprintf(err, errlen, "%s:%d: a row with wrong results (#wrong %s): its time is no "
                     "calibration", path, lineno, tok[n - 1]);
            fclose(f);
            return -1;
        }
        if (strcmp(tok[0], "ceiling:") == 0) {
            if (strcmp(tok[1], "copy") == 0) t->copy_gbs = gbs;
            continue;
        }
        char text[256] = "";
        for (int k = 1; k < n - 5; k++) {
            strncat(text, " ", sizeof text - strlen(text) - 1);
            strncat(text, tok[k], sizeof text - strlen(text) - 1);
        }
        sim_shape s;
        int rc = parse_shape(tok[0], text, &s);
        if (rc < 0) continue; /* an op the model does not call (the ceilings' matmul) */
        if (rc > 0 || us <= 0) continue;
        add_entry(t, &s, us);
        if (s.op == SIM_ACCUMULATE) accumulate_gbs = shape_bytes(&s) / us * 1e-3;
    }
    fclose(f);
    if (t->n == 0) {
        snprintf(err, errlen, "%s: no op rows (bench_kernels' output format)", path);
        return -1;
    }
    /* bench_kernels' tables (a GPU's: they carry its ceilings) floor a scaled-down op at
     * a kernel launch; --measure-ops' (the cpu backend, every shape exact) at nothing */
    t->launch_us = t->copy_gbs > 0 ? 3.0 : 0.0;
    if (t->copy_gbs <= 0) t->copy_gbs = accumulate_gbs;
    return 0;
}

void sim_table_free(sim_op_table *t) {
    free(t->e);
    memset(t, 0, sizeof *t);
}

double sim_table_us(const sim_op_table *t, const sim_shape *s) {
    const double w = sim_shape_work(s);
    const sim_table_entry *best = NULL;
    double best_d = INFINITY;
    for (int i = 0; i < t->n; i++) {
        const sim_table_entry *e = &t->e[i];
        if (e->shape.op != s->op) continue;
        if (memcmp(e->shape.d, s->d, sizeof s->d) == 0) return e->us;
        double dist = fabs(log(sim_shape_work(&e->shape) / w));
        if (s->op == SIM_ATTENTION_BWD && e->shape.d[5] != s->d[5]) dist += 100; /* same rope */
        if (dist < best_d) best_d = dist, best = e;
    }
    if (best) {
        double us = best->us * w / sim_shape_work(&best->shape);
        return us < t->launch_us ? t->launch_us : us;
    }
    double bytes = shape_bytes(s);
    if (bytes > 0 && t->copy_gbs > 0) {
        double us = bytes / (t->copy_gbs * 1e3);
        return us < t->launch_us ? t->launch_us : us;
    }
    char shape[128];
    sim_shape_format(s, shape, sizeof shape);
    fprintf(stderr, "perf_model: error: the op table %s has no %s row (called at %s)\n", t->source,
            sim_op_name(s->op), shape);
    exit(1);
}
