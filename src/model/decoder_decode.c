/* The decoder's KV-cache generator (decoder.h; family.h's decode side): every block's keys
 * and values of each token a row was fed stay in that row's cache, so a step feeds one
 * token a row instead of the whole sequence.
 *
 * A prompt and a step are the same pass (`feed`): Tn new tokens for each of n rows, rows
 * right-padded to Tn, through the forward's own ops in the forward's order: the
 * embedding; per block RMSNorm, the fused q|k|v product (the model's recipe: decoder_linear)
 * and the q|k|v biases, RoPE at each row's own positions (pos0: after what its cache
 * holds), attention_decode over the row's cache (which first appends the new keys and
 * values), the o product with its residual, RMSNorm, gate|up, SwiGLU, down with its
 * residual; then the final norm and the output projection of the rows whose logits are
 * wanted, at their last real token. A prompt goes through attention_decode rather than
 * attention_fwd + kv_append: one path for prompts and steps; memory for rows·chunk tokens
 * whatever the prompt's length (a long prompt goes in parts, each attending to what the
 * parts before it cached); and on the cpu the bits of attention_fwd (ops.h). cuda's
 * tensor-core attention_fwd would prefill long prompts faster; in a generation the prompt
 * is one pass among as many as the reply has tokens. */
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/check.h"
#include "src/model/decoder.h"

struct decoder_gen {
    decoder *m;
    decoder_parts p;
    int rows, cap;
    int n_max;              /* tokens a pass feeds at most: rows·min(cap, DECODER_GEN_CHUNK) */
    size_t esz, bytes;
    int qkv_dim, att_dim;
    void **k, **v;          /* L caches (rows, nkv, cap, hd), act (ops.h's layout) */
    void *x, *xmid, *ln;    /* (n_max, d) residual stream, after attention, a norm's output */
    void *qkv, *att;        /* (n_max, (nh+2·nkv)·hd), (n_max, nh·hd) */
    void *gu, *h;           /* (n_max, 2F) [gate | up], (n_max, F) */
    float *rstd;            /* (n_max) */
    void *last;             /* (rows, d): the last token of each row whose logits are wanted */
    void *logits;           /* (rows, V) */
    int32_t *tokens_dev;    /* (n_max) */
    int32_t *pos_dev;       /* (rows) the pass's rows' lengths before it, in pass order */
    /* host */
    int32_t *len;           /* (rows) tokens each row's cache holds */
    int32_t *tok_h, *pos_h; /* (n_max), (rows) what goes to tokens_dev, pos_dev */
    int *sel, *fed, *real, *last_i, *pass_rows; /* (rows) a prefill's bookkeeping */
    float **dst;            /* (rows) */
    uint16_t *bf16_h;       /* (V) a row of bf16 logits on its way to fp32 */
    /* a decode step recorded (ops->graph_begin) for the rows graph_rows[0..graph_n), and the
     * rows of the last decode step run op by op (recorded when the next has the same) */
    void *graph;
    int graph_n, seen_n;
    int *graph_rows, *seen_rows;
};

/* Allocation (g != NULL) or counting of the generator's backend buffers: one walk, so the
 * plan's figure and what is allocated come from the same list. */
typedef struct walk {
    const shlm_ops *ops; /* NULL: count only */
    size_t esz, align, bytes;
} walk;

static void *take(walk *w, size_t elems, size_t elem_bytes) {
    const size_t b = elems * elem_bytes;
    w->bytes += (b + w->align - 1) / w->align * w->align;
    return w->ops ? w->ops->alloc(b) : NULL;
}

static size_t walk_buffers(decoder_gen *g, const decoder_config *c, const shlm_ops *ops,
                           size_t esz, int rows, int cap, size_t align) {
    walk w = {g ? ops : NULL, esz, align > 0 ? align : 1, 0};
    const size_t chunk = (size_t)(cap < DECODER_GEN_CHUNK ? cap : DECODER_GEN_CHUNK);
    const size_t n = (size_t)rows * chunk, d = (size_t)c->dim, F = (size_t)c->ffn_dim;
    const size_t hd = (size_t)c->head_dim, nkv = (size_t)c->n_kv_heads;
    const size_t qkv = ((size_t)c->n_heads + 2 * nkv) * hd, att = (size_t)c->n_heads * hd;
    const size_t cache = (size_t)rows * nkv * (size_t)cap * hd;
    for (int l = 0; l < c->n_layers; l++) {
        void *k = take(&w, cache, esz), *v = take(&w, cache, esz);
        if (g) g->k[l] = k, g->v[l] = v;
    }
#define BUF(field, elems, elem_bytes)                        \
    do {                                                     \
        void *p_ = take(&w, (elems), (elem_bytes));          \
        if (g) g->field = p_;                                \
    } while (0)
    BUF(x, n * d, esz);
    BUF(xmid, n * d, esz);
    BUF(ln, n * d, esz);
    BUF(qkv, n * qkv, esz);
    BUF(att, n * att, esz);
    BUF(gu, n * 2 * F, esz);
    BUF(h, n * F, esz);
    BUF(rstd, n, sizeof(float));
    BUF(last, (size_t)rows * d, esz);
    BUF(logits, (size_t)rows * (size_t)c->vocab_size, esz);
    BUF(tokens_dev, n, sizeof(int32_t));
    BUF(pos_dev, (size_t)rows, sizeof(int32_t));
#undef BUF
    return w.bytes;
}

size_t decoder_generator_bytes(const void *cfg, shlm_dtype act, int rows, int cap,
                               size_t align) {
    return walk_buffers(NULL, cfg, NULL, shlm_dtype_size(act), rows, cap, align);
}

decoder_gen *decoder_gen_create(decoder *m, int rows, int cap) {
    decoder_gen *g = calloc(1, sizeof *g);
    SHLM_CHECK_ALLOC(g);
    g->m = m;
    g->p = decoder_parts_of(m);
    const decoder_config *c = g->p.cfg;
    g->rows = rows;
    g->cap = cap;
    g->n_max = rows * (cap < DECODER_GEN_CHUNK ? cap : DECODER_GEN_CHUNK);
    g->esz = shlm_dtype_size(g->p.ops->act_dtype);
    g->qkv_dim = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    g->att_dim = c->n_heads * c->head_dim;
    g->k = calloc((size_t)c->n_layers, sizeof(void *));
    g->v = calloc((size_t)c->n_layers, sizeof(void *));
    SHLM_CHECK_ALLOC(g->k);
    SHLM_CHECK_ALLOC(g->v);
    g->bytes = walk_buffers(g, c, g->p.ops, g->esz, rows, cap, 1);
    g->len = calloc((size_t)rows, sizeof *g->len);
    g->tok_h = malloc((size_t)g->n_max * sizeof *g->tok_h);
    g->pos_h = malloc((size_t)rows * sizeof *g->pos_h);
    int **ints[] = {&g->sel, &g->fed, &g->real, &g->last_i, &g->pass_rows, &g->graph_rows,
                    &g->seen_rows};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        *ints[i] = malloc((size_t)rows * sizeof(int));
        SHLM_CHECK_ALLOC(*ints[i]);
    }
    g->dst = malloc((size_t)rows * sizeof *g->dst);
    g->bf16_h = malloc((size_t)c->vocab_size * sizeof *g->bf16_h);
    SHLM_CHECK_ALLOC(g->len);
    SHLM_CHECK_ALLOC(g->tok_h);
    SHLM_CHECK_ALLOC(g->pos_h);
    SHLM_CHECK_ALLOC(g->dst);
    SHLM_CHECK_ALLOC(g->bf16_h);
    return g;
}

void decoder_gen_destroy(decoder_gen *g) {
    if (!g) return;
    const shlm_ops *o = g->p.ops;
    if (g->graph) o->graph_free(g->graph);
    for (int l = 0; l < g->p.cfg->n_layers; l++) {
        o->free(g->k[l]);
        o->free(g->v[l]);
    }
    void *dev[] = {g->x, g->xmid, g->ln, g->qkv, g->att, g->gu, g->h, g->rstd,
                   g->last, g->logits, g->tokens_dev, g->pos_dev};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) o->free(dev[i]);
    void *host[] = {g->k, g->v, g->len, g->tok_h, g->pos_h, g->sel, g->fed, g->real,
                    g->last_i, g->pass_rows, g->graph_rows, g->seen_rows, g->dst, g->bf16_h};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    free(g);
}

size_t decoder_gen_bytes(const decoder_gen *g) { return g->bytes; }

/* Rows rows[0..n) ascending, distinct and of this generator (aborts otherwise: a caller's
 * bug). */
static void check_rows(const decoder_gen *g, const char *what, int n, const int *rows) {
    if (n < 1 || n > g->rows) SHLM_FATAL("%s: %d rows of a generator of %d", what, n, g->rows);
    for (int i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= g->rows || (i > 0 && rows[i] <= rows[i - 1]))
            SHLM_FATAL("%s: rows[%d] = %d (rows are ascending, in [0, %d))", what, i, rows[i],
                       g->rows);
}

/* attention_decode over the pass's rows, one call per run of consecutive rows (a run's
 * caches and positions are contiguous). */
static void attend(decoder_gen *g, int l, int n, const int *rows, int Tn) {
    const decoder_config *c = g->p.cfg;
    const size_t row_cache = (size_t)c->n_kv_heads * g->cap * c->head_dim * g->esz;
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && rows[j] == rows[j - 1] + 1) j++;
        g->p.ops->attention_decode((char *)g->att + (size_t)i * Tn * g->att_dim * g->esz,
                                   (char *)g->k[l] + rows[i] * row_cache,
                                   (char *)g->v[l] + rows[i] * row_cache,
                                   (const char *)g->qkv + (size_t)i * Tn * g->qkv_dim * g->esz,
                                   g->pos_dev + i, j - i, Tn, g->cap, c->n_heads,
                                   c->n_kv_heads, c->head_dim);
        i = j;
    }
}

/* The device work of a pass (feed): embedding, blocks, and the head over the rows whose
 * logits are wanted, into g->logits. Queues only device work (ops.h graph_begin). */
static void queue_pass(decoder_gen *g, int n, const int *rows, int Tn, const int *last_i) {
    const decoder_config *c = g->p.cfg;
    const shlm_ops *o = g->p.ops;
    const model_param_source *src = &g->p.src;
    const int N = n * Tn, d = c->dim, V = c->vocab_size;
    const void *p = src->acquire(src->ctx, DECODER_UNIT_EMBED, MODEL_FWD);
    o->embedding_fwd(g->x, g->tokens_dev, p, N, d); /* the embedding is unit 0's tensor 0 */
    src->release(src->ctx, DECODER_UNIT_EMBED, MODEL_FWD);
    for (int l = 0; l < c->n_layers; l++) {
        const int u = decoder_unit_block(l);
        p = src->acquire(src->ctx, u, MODEL_FWD);
        o->rmsnorm_fwd(g->ln, g->rstd, g->x, decoder_part_ptr(g->m, p, l, DECODER_LN1), N, d,
                       c->norm_eps, NULL);
        decoder_linear(g->m, p, l, DECODER_QKV, g->qkv, g->ln, N, NULL);
        if (c->qkv_bias)
            o->bias_add(g->qkv, decoder_part_ptr(g->m, p, l, DECODER_QKV_BIAS), N, g->qkv_dim);
        o->rope(g->qkv, N, Tn, g->qkv_dim, c->n_heads + c->n_kv_heads, g->p.rope, g->pos_dev, 0);
        attend(g, l, n, rows, Tn);
        decoder_linear(g->m, p, l, DECODER_O, g->xmid, g->att, N, g->x);
        o->rmsnorm_fwd(g->ln, g->rstd, g->xmid, decoder_part_ptr(g->m, p, l, DECODER_LN2), N,
                       d, c->norm_eps, NULL);
        decoder_linear(g->m, p, l, DECODER_GATE_UP, g->gu, g->ln, N, NULL);
        o->swiglu_fwd(g->h, g->gu, N, c->ffn_dim, NULL);
        decoder_linear(g->m, p, l, DECODER_DOWN, g->x, g->h, N, g->xmid);
        src->release(src->ctx, u, MODEL_FWD);
    }
    /* the head over the wanted rows' last tokens only (RMSNorm and the product are per row:
     * the forward's values for them) */
    int nw = 0;
    for (int i = 0; i < n; i++)
        if (last_i[i] >= 0)
            o->copy((char *)g->last + (size_t)nw++ * d * g->esz,
                    (const char *)g->x + ((size_t)i * Tn + last_i[i]) * d * g->esz,
                    (size_t)d * g->esz);
    if (nw == 0) return;
    p = src->acquire(src->ctx, g->p.head, MODEL_HEAD);
    o->rmsnorm_fwd(g->ln, g->rstd, g->last, decoder_part_ptr(g->m, p, 0, DECODER_NORM), nw, d,
                   c->norm_eps, NULL);
    o->matmul_fwd(g->logits, g->ln, decoder_part_ptr(g->m, p, 0, DECODER_OUT), nw, d, V, NULL);
    src->release(src->ctx, g->p.head, MODEL_HEAD);
}

/* Whether this pass runs as a recorded decode step: one token for each of the rows of the
 * step before (the step after a step run op by op is recorded, then replayed while the rows
 * stay), on a backend that records, with the weights held (model_param_source.held). Any
 * other pass drops the recording. */
static int replayable(decoder_gen *g, int n, const int *rows, int Tn) {
    const shlm_ops *o = g->p.ops;
    const model_param_source *src = &g->p.src;
    const int ok = Tn == 1 && !g->p.eager_decode && o->graph_begin && src->held && src->held(src->ctx);
    const size_t rb = (size_t)n * sizeof *rows;
    if (g->graph && !(ok && g->graph_n == n && !memcmp(g->graph_rows, rows, rb))) {
        o->graph_free(g->graph);
        g->graph = NULL;
    }
    const int seen = ok && g->seen_n == n && !memcmp(g->seen_rows, rows, rb);
    g->seen_n = Tn == 1 ? n : 0;
    if (Tn == 1) memcpy(g->seen_rows, rows, rb);
    return g->graph != NULL || seen;
}

/* One pass: row rows[i] takes Tn tokens tok[i·Tn ..], the first real[i] of them its own
 * (the rest padding, never attended to by them, whose cache slots the row's next tokens
 * overwrite), after the len[rows[i]] it holds (len + Tn <= cap). dst[i] (host, V floats)
 * receives the logits after its token last_i[i] when last_i[i] >= 0. */
static void feed(decoder_gen *g, int n, const int *rows, int Tn, const int32_t *tok,
                 const int *real, const int *last_i, float *const *dst) {
    const shlm_ops *o = g->p.ops;
    const int N = n * Tn, V = g->p.cfg->vocab_size;
    for (int i = 0; i < n; i++) {
        if (g->len[rows[i]] + Tn > g->cap)
            SHLM_FATAL("decoder_gen: row %d holds %d tokens; %d more pass its cache of %d",
                       rows[i], (int)g->len[rows[i]], Tn, g->cap);
        g->pos_h[i] = g->len[rows[i]];
    }
    o->to_device(g->tokens_dev, tok, (size_t)N * sizeof(int32_t));
    o->to_device(g->pos_dev, g->pos_h, (size_t)n * sizeof(int32_t));
    int nw = 0;
    for (int i = 0; i < n; i++) nw += last_i[i] >= 0;
    if (replayable(g, n, rows, Tn)) {
        if (g->graph) {
            o->graph_launch(g->graph);
        } else {
            o->graph_begin();
            queue_pass(g, n, rows, Tn, last_i);
            g->graph = o->graph_end();
            if (g->graph) {
                g->graph_n = n;
                memcpy(g->graph_rows, rows, (size_t)n * sizeof *rows);
                o->graph_launch(g->graph);
            } else {
                queue_pass(g, n, rows, Tn, last_i);
            }
        }
    } else {
        queue_pass(g, n, rows, Tn, last_i);
    }
    for (int i = 0; i < n; i++) g->len[rows[i]] += real[i];
    if (nw == 0) return;
    for (int i = 0, j = 0; i < n; i++) {
        if (last_i[i] < 0) continue;
        const char *row = (const char *)g->logits + (size_t)j++ * V * g->esz;
        if (g->esz == sizeof(float)) {
            o->to_host(dst[i], row, (size_t)V * sizeof(float));
        } else {
            o->to_host(g->bf16_h, row, (size_t)V * g->esz);
            for (int v = 0; v < V; v++) dst[i][v] = shlm_bf16_to_f32(g->bf16_h[v]);
        }
    }
}

void decoder_gen_prefill(decoder_gen *g, int n, const int *rows,
                         const int32_t *const *prompts, const int *lens, float *logits) {
    check_rows(g, "decoder_gen_prefill", n, rows);
    const int V = g->p.cfg->vocab_size;
    for (int i = 0; i < n; i++) {
        if (lens[i] < 1 || lens[i] > g->cap)
            SHLM_FATAL("decoder_gen_prefill: a prompt of %d tokens for a cache of %d", lens[i],
                       g->cap);
        g->len[rows[i]] = 0;
        g->fed[i] = 0;
    }
    for (;;) {
        /* the rows with prompt tokens left; each pass feeds every one of them as many as
         * the pass holds and the shortest room in their caches allows */
        int na = 0, most = 0, room = g->cap;
        for (int i = 0; i < n; i++) {
            const int left = lens[i] - g->fed[i];
            if (left <= 0) continue;
            g->sel[na++] = i;
            if (left > most) most = left;
            if (g->cap - g->len[rows[i]] < room) room = g->cap - g->len[rows[i]];
        }
        if (na == 0) break;
        int Tn = g->n_max / na;
        if (Tn > most) Tn = most;
        if (Tn > room) Tn = room;
        for (int a = 0; a < na; a++) {
            const int i = g->sel[a], left = lens[i] - g->fed[i];
            const int r = left < Tn ? left : Tn;
            int32_t *t = g->tok_h + (size_t)a * Tn;
            memcpy(t, prompts[i] + g->fed[i], (size_t)r * sizeof *t);
            for (int k = r; k < Tn; k++) t[k] = t[r - 1];
            g->pass_rows[a] = rows[i];
            g->real[a] = r;
            g->last_i[a] = r == left ? r - 1 : -1;
            g->dst[a] = logits + (size_t)i * V;
        }
        feed(g, na, g->pass_rows, Tn, g->tok_h, g->real, g->last_i, g->dst);
        for (int a = 0; a < na; a++) g->fed[g->sel[a]] += g->real[a];
    }
}

void decoder_gen_decode(decoder_gen *g, int n, const int *rows, const int32_t *tokens,
                        float *logits) {
    check_rows(g, "decoder_gen_decode", n, rows);
    const int V = g->p.cfg->vocab_size;
    for (int i = 0; i < n; i++) {
        g->real[i] = 1;
        g->last_i[i] = 0;
        g->dst[i] = logits + (size_t)i * V;
    }
    feed(g, n, rows, 1, tokens, g->real, g->last_i, g->dst);
}
