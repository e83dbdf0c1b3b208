/* Greedy and temperature/top-p sampling, the generation loop over a KV-cache generator's
 * rows with the window recompute beside it, and the text printed as it streams (see
 * sample.h). */
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

/* A generation under way: which sequence each row holds, each row's next-token logits. */
typedef struct gen_run {
    model *m;
    model_gen *gen;          /* NULL: every token by the window */
    int max_ctx, V, rows, cap, n_new;
    sample_seq *seqs;
    const sample_options *o;
    int *seq_of;             /* (rows) the sequence in row r, -1: none */
    float *logits;           /* (rows, V) row r's next-token logits */
    float *packed;           /* (rows, V) a generator call's logits, in the order named */
    rng_state *rng;          /* (n) each sequence's draws */
    int *cached;             /* (rows) the rows a generator call names */
    int32_t *tok;            /* (rows) */
    const int32_t **prompts; /* (rows) */
    int *lens;               /* (rows) */
} gen_run;

/* Row r's logits from its sequence's window: its last max_ctx tokens through the forward. */
static void window_logits(gen_run *g, int r) {
    const sample_seq *s = &g->seqs[g->seq_of[r]];
    const int len = s->n_prompt + s->n_gen, ctx = len < g->max_ctx ? len : g->max_ctx;
    const model_batch b = {s->out + len - ctx, NULL, NULL, 1, ctx, NULL};
    model_forward(g->m, &b, NULL, NULL, g->logits + (size_t)r * g->V);
}

/* The n rows listed (ascending) get their next-token logits: rows that just took a
 * sequence (start) from a prefill of its prompt, the others from feeding their last
 * token; either from the window where the cache cannot hold the sequence. */
static void next_logits(gen_run *g, const int *list, int n, int start) {
    int nc = 0;
    for (int i = 0; i < n; i++) {
        const int r = list[i];
        const sample_seq *s = &g->seqs[g->seq_of[r]];
        /* the cache holds every token but the last sampled one, which a step feeds */
        const int held = start ? s->n_prompt : s->n_prompt + s->n_gen;
        if (!g->gen || held > g->cap) {
            window_logits(g, r);
            continue;
        }
        g->cached[nc] = r;
        g->prompts[nc] = s->out;
        g->lens[nc] = s->n_prompt;
        g->tok[nc] = s->out[s->n_prompt + s->n_gen - 1];
        nc++;
    }
    if (nc == 0) return;
    if (start) model_gen_prefill(g->gen, nc, g->cached, g->prompts, g->lens, g->packed);
    else model_gen_decode(g->gen, nc, g->cached, g->tok, g->packed);
    for (int i = 0; i < nc; i++)
        memcpy(g->logits + (size_t)g->cached[i] * g->V, g->packed + (size_t)i * g->V,
               (size_t)g->V * sizeof(float));
}

void sample_generate(model *m, model_gen *gen, int max_ctx, sample_seq *seqs, int n, int n_new,
                     const sample_options *o) {
    const int V = model_shape_vocab_size(model_shape_of(m));
    const int rows = gen ? model_gen_rows(gen) : 1;
    gen_run g = {.m = m, .gen = gen, .max_ctx = max_ctx, .V = V, .rows = rows,
                 .cap = gen ? model_gen_cap(gen) : 0, .n_new = n_new, .seqs = seqs, .o = o};
    for (int i = 0; i < n; i++) {
        memcpy(seqs[i].out, seqs[i].prompt, (size_t)seqs[i].n_prompt * sizeof(int32_t));
        seqs[i].n_gen = 0;
        seqs[i].stopped = 0;
    }
    if (n_new <= 0 || n <= 0) {
        for (int i = 0; o->on_end && i < n; i++) o->on_end(o->ctx, i);
        return;
    }
    g.seq_of = malloc((size_t)rows * sizeof *g.seq_of);
    g.logits = malloc((size_t)rows * V * sizeof(float));
    g.packed = malloc((size_t)rows * V * sizeof(float));
    g.rng = malloc((size_t)n * sizeof *g.rng);
    g.cached = malloc((size_t)rows * sizeof(int));
    g.tok = malloc((size_t)rows * sizeof *g.tok);
    g.prompts = malloc((size_t)rows * sizeof *g.prompts);
    g.lens = malloc((size_t)rows * sizeof(int));
    int32_t *drawn = malloc((size_t)rows * sizeof *drawn);
    int *cont = malloc((size_t)rows * sizeof *cont), *fresh = malloc((size_t)rows * sizeof *fresh);
    SHLM_CHECK_ALLOC(g.seq_of);
    SHLM_CHECK_ALLOC(g.logits);
    SHLM_CHECK_ALLOC(g.packed);
    SHLM_CHECK_ALLOC(g.rng);
    SHLM_CHECK_ALLOC(g.cached);
    SHLM_CHECK_ALLOC(g.tok);
    SHLM_CHECK_ALLOC(g.prompts);
    SHLM_CHECK_ALLOC(g.lens);
    SHLM_CHECK_ALLOC(drawn);
    SHLM_CHECK_ALLOC(cont);
    SHLM_CHECK_ALLOC(fresh);
    for (int i = 0; i < n; i++) rng_seed(&g.rng[i], o->seed + (uint64_t)i);
    int next = 0, n_fresh = 0;
    for (int r = 0; r < rows; r++) {
        g.seq_of[r] = next < n ? next++ : -1;
        if (g.seq_of[r] >= 0) fresh[n_fresh++] = r;
    }
    next_logits(&g, fresh, n_fresh, 1);
    for (;;) {
        /* every row holding a sequence has its next-token logits: draw, agree, append */
        int active = 0;
        for (int r = 0; r < rows; r++) {
            drawn[r] = -1;
            if (g.seq_of[r] < 0) continue;
            drawn[r] = sample_token(g.logits + (size_t)r * V, V, o->temperature, o->top_p,
                                    &g.rng[g.seq_of[r]]);
            active++;
        }
        if (active == 0) break;
        MPI_CHECK(MPI_Bcast(drawn, rows, MPI_INT32_T, 0, MPI_COMM_WORLD));
        int n_cont = 0;
        n_fresh = 0;
        for (int r = 0; r < rows; r++) {
            const int i = g.seq_of[r];
            if (i < 0) continue;
            sample_seq *s = &seqs[i];
            s->out[s->n_prompt + s->n_gen++] = drawn[r];
            if (o->on_token) o->on_token(o->ctx, i, drawn[r]);
            s->stopped = is_stop(o, drawn[r]);
            if (!s->stopped && s->n_gen < n_new) {
                cont[n_cont++] = r;
                continue;
            }
            if (o->on_end) o->on_end(o->ctx, i);
            g.seq_of[r] = next < n ? next++ : -1;
            if (g.seq_of[r] >= 0) fresh[n_fresh++] = r;
        }
        next_logits(&g, cont, n_cont, 0);
        next_logits(&g, fresh, n_fresh, 1);
    }
    free(g.seq_of);
    free(g.logits);
    free(g.packed);
    free(g.rng);
    free(g.cached);
    free(g.tok);
    free(g.prompts);
    free(g.lens);
    free(drawn);
    free(cont);
    free(fresh);
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

static void on_token(void *ctx, int i, int32_t id) {
    printer *p = ctx;
    (void)i;
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

int sample_print(model *m, model_gen *gen, tokenizer *tok, int ids, int max_ctx,
                 const int32_t *prompt, int n_prompt, int n_new, const sample_options *o,
                 FILE *out, int32_t *all) {
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
    so.on_end = NULL;
    so.ctx = &p;
    sample_seq seq = {.prompt = prompt, .n_prompt = n_prompt, .out = all};
    sample_generate(m, gen, max_ctx, &seq, 1, n_new, &so);
    if (out && !ids) {
        char err[256];
        p.text.n = 0;
        if (tokenizer_stream_flush(tok, &p.stream, &p.text, err, sizeof err) == 0)
            fwrite(p.text.data, 1, p.text.n, out);
        fflush(out);
    }
    tokenizer_stream_free(&p.stream);
    free(p.text.data);
    return seq.n_gen;
}

/* The closing sample of a run (train.sample_*): the prompt encoded with the job's
 * tokenizer (bos as the model's configuration says), the continuation printed as it
 * comes, ending at an eos, through the run's generator (its plan's: job_sample_gen). */
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
    sample_print(r->model, r->gen, r->tok, show_ids, c->seq_len, p.ids, (int)p.n,
                 c->sample_tokens, &so, r->rank == 0 ? stdout : NULL, ids);
    if (r->rank == 0) {
        printf("\n---\n");
        fflush(stdout);
    }
    free(ids);
    free(p.ids);
}
