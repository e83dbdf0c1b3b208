/* Greedy and temperature/top-p sampling, the generation loop, and its text printed as it
 * streams (see sample.h). */
#include "src/run/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"

typedef struct prob_idx { float p; int i; } prob_idx;

static int by_prob_desc(const void *a, const void *b) {
    const prob_idx *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->i - y->i; /* ties by index: deterministic across libc qsort versions */
}

int sample_token(const float *logits, int V, float temperature, float top_p, rng_state *r) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    prob_idx *pi = malloc((size_t)V * sizeof *pi);
    SHLM_CHECK_ALLOC(pi);
    double sum = 0;
    for (int i = 0; i < V; i++) {
        pi[i].p = (float)exp((logits[i] - logits[best]) / temperature);
        pi[i].i = i;
        sum += pi[i].p;
    }
    qsort(pi, (size_t)V, sizeof *pi, by_prob_desc);
    double mass = 0, keep_mass = 0;
    int keep = 0;
    while (keep < V && (keep == 0 || mass < top_p)) {
        mass += pi[keep].p / sum;
        keep_mass += pi[keep].p;
        keep++;
    }
    double u = rng_uniform(r) * keep_mass, acc = 0;
    int choice = pi[keep - 1].i;
    for (int k = 0; k < keep; k++) {
        acc += pi[k].p;
        if (u < acc) {
            choice = pi[k].i;
            break;
        }
    }
    free(pi);
    return choice;
}

static int is_stop(const sample_options *o, int32_t id) {
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop_ids[i] == id) return 1;
    return 0;
}

int sample_generate(model *m, int max_ctx, const int32_t *prompt, int n_prompt,
                    int n_new, const sample_options *o, int32_t *out) {
    const int V = model_shape_vocab_size(model_shape_of(m));
    float *logits = malloc((size_t)V * sizeof(float));
    SHLM_CHECK_ALLOC(logits);
    rng_state r;
    rng_seed(&r, o->seed);
    memcpy(out, prompt, (size_t)n_prompt * sizeof(int32_t));
    int len = n_prompt, k = 0;
    while (k < n_new) {
        int ctx = len < max_ctx ? len : max_ctx;
        const model_batch b = {out + len - ctx, NULL, NULL, 1, ctx, NULL};
        model_forward(m, &b, NULL, NULL, logits);
        const int32_t id = sample_token(logits, V, o->temperature, o->top_p, &r);
        out[len++] = id;
        k++;
        if (o->on_token) o->on_token(o->ctx, id);
        if (is_stop(o, id)) break;
    }
    free(logits);
    return k;
}

/* What sample_print's callback needs. */
typedef struct printer {
    tokenizer *tok;
    tokenizer_stream stream;
    byte_buf text;
    int ids;
    FILE *out;
} printer;

static void print_id(printer *p, int32_t id) {
    fprintf(p->out, "[%d]", (int)id);
}

static void on_token(void *ctx, int32_t id) {
    printer *p = ctx;
    if (!p->out) return;
    if (p->ids) {
        fprintf(p->out, " %d", (int)id);
    } else {
        char err[256];
        p->text.n = 0;
        if (tokenizer_stream_push(p->tok, &p->stream, id, &p->text, err, sizeof err) != 0) {
            /* an id past the tokenizer's vocabulary: shown, and the stream goes on */
            tokenizer_stream_free(&p->stream);
            tokenizer_stream_init(&p->stream, TOKENIZER_SKIP_SPECIAL);
            print_id(p, id);
        }
        fwrite(p->text.data, 1, p->text.n, p->out);
    }
    fflush(p->out);
}

int sample_print(model *m, tokenizer *tok, int ids, int max_ctx, const int32_t *prompt,
                 int n_prompt, int n_new, const sample_options *o, FILE *out, int32_t *all) {
    printer p = {.tok = tok, .ids = ids, .out = out};
    tokenizer_stream_init(&p.stream, TOKENIZER_SKIP_SPECIAL);
    if (out) {
        char err[256];
        if (ids) {
            for (int i = 0; i < n_prompt; i++) fprintf(out, "%s%d", i ? " " : "", (int)prompt[i]);
        } else if (tokenizer_decode(tok, prompt, (size_t)n_prompt, 0, &p.text, err, sizeof err) == 0) {
            fwrite(p.text.data, 1, p.text.n, out);
        } else {
            for (int i = 0; i < n_prompt; i++) print_id(&p, prompt[i]);
        }
        fflush(out);
    }
    sample_options so = *o;
    so.on_token = on_token;
    so.ctx = &p;
    const int n = sample_generate(m, max_ctx, prompt, n_prompt, n_new, &so, all);
    if (out && !ids) {
        char err[256];
        p.text.n = 0;
        if (tokenizer_stream_flush(tok, &p.stream, &p.text, err, sizeof err) == 0)
            fwrite(p.text.data, 1, p.text.n, out);
        fflush(out);
    }
    tokenizer_stream_free(&p.stream);
    free(p.text.data);
    return n;
}

/* The closing sample of a run (train.sample_*): the prompt encoded with the job's
 * tokenizer (bos as the model's configuration says), the continuation printed as it
 * comes, ending at an eos. */
void run_print_sample(run *r) {
    const job_config *c = &r->cfg;
    const char *prompt = c->sample_prompt[0] ? c->sample_prompt : "\n";
    token_ids p = {0};
    char err[512];
    int ok = tokenizer_encode_with(r->tok, prompt, strlen(prompt),
                                   tokenizer_default_flags(r->tok) & TOKENIZER_ADD_BOS, &p, err,
                                   sizeof err) == 0;
    if (any_rank_failed(ok && p.n > 0, ok ? "train.sample_prompt encodes to no token" : err)) {
        free(p.ids);
        return;
    }
    int32_t *ids = malloc((p.n + (size_t)c->sample_tokens) * sizeof(int32_t));
    SHLM_CHECK_ALLOC(ids);
    int n_stop = 0;
    const int32_t *stop = tokenizer_eos_ids(r->tok, &n_stop);
    const sample_options so = {.temperature = c->sample_temperature, .top_p = c->sample_top_p,
                               .seed = c->seed, .stop_ids = stop, .n_stop = n_stop};
    fsdp_begin_pass(r->engine, 0);
    if (r->rank == 0)
        printf("--- sample: up to %d tokens, temperature %.2f, top_p %.2f ---\n",
               c->sample_tokens, c->sample_temperature, c->sample_top_p);
    const int show_ids = strcmp(tokenizer_kind(r->tok), "bytes") == 0 && model_shape_vocab_size(&c->model) != 256;
    sample_print(r->model, r->tok, show_ids, c->seq_len, p.ids, (int)p.n, c->sample_tokens, &so,
                 r->rank == 0 ? stdout : NULL, ids);
    if (r->rank == 0) {
        printf("\n---\n");
        fflush(stdout);
    }
    free(ids);
    free(p.ids);
}
