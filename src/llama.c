/* The Llama-2 model over the ops table: parameter layout and init, forward,
 * fused loss, and backward, one FSDP unit at a time through a param source. */
#include "src/llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "src/rng.h"

/* ------------------------------------------------------------------ layout */

static void add_tensor(llama_unit *u, const char *name, int64_t rows, int64_t cols,
                       int decay) {
    llama_tensor *t = &u->tensors[u->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 0;
    t->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    t->offset = u->numel;
    t->weight_decay = decay;
    u->numel += t->numel;
}

void llama_layout_init(llama_layout *lay, const llama_config *c) {
    int64_t d = c->dim, hd = c->head_dim, F = c->ffn_dim, V = c->vocab_size;
    lay->n_units = c->n_layers + 2;
    lay->units = calloc((size_t)lay->n_units, sizeof(llama_unit));
    SHLM_CHECK_ALLOC(lay->units);
    add_tensor(&lay->units[LLAMA_UNIT_EMBED], "model.embed_tokens.weight", V, d, 1);
    char name[96];
    for (int l = 0; l < c->n_layers; l++) {
        llama_unit *u = &lay->units[llama_unit_block(l)];
#define T_(suffix, rows, cols, decay)                                         \
    do {                                                                      \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);         \
        add_tensor(u, name, rows, cols, decay);                               \
    } while (0)
        T_("input_layernorm.weight", d, 0, 0);
        T_("self_attn.q_proj.weight", c->n_heads * hd, d, 1);
        T_("self_attn.k_proj.weight", c->n_kv_heads * hd, d, 1);
        T_("self_attn.v_proj.weight", c->n_kv_heads * hd, d, 1);
        T_("self_attn.o_proj.weight", d, c->n_heads * hd, 1);
        T_("post_attention_layernorm.weight", d, 0, 0);
        T_("mlp.gate_proj.weight", F, d, 1);
        T_("mlp.up_proj.weight", F, d, 1);
        T_("mlp.down_proj.weight", d, F, 1);
#undef T_
    }
    llama_unit *h = &lay->units[llama_unit_head(c)];
    add_tensor(h, "model.norm.weight", d, 0, 0);
    add_tensor(h, "lm_head.weight", V, d, 1);
    lay->total_numel = 0;
    for (int u = 0; u < lay->n_units; u++) lay->total_numel += lay->units[u].numel;
}

void llama_layout_free(llama_layout *lay) {
    free(lay->units);
    lay->units = NULL;
    lay->n_units = 0;
}

void llama_init_slice(const llama_layout *lay, const llama_config *cfg, uint64_t seed, int u,
                      size_t begin, size_t end, float *out) {
    const llama_unit *unit = &lay->units[u];
    /* one independent stream per unit: element i of unit u depends only on (seed,u,i) */
    uint64_t key = rng_hash64(seed ^ rng_hash64(0x11a3a000ull + (uint64_t)u));
    for (int k = 0; k < unit->n_tensors; k++) {
        const llama_tensor *t = &unit->tensors[k];
        size_t lo = t->offset > begin ? t->offset : begin;
        size_t hi = t->offset + t->numel < end ? t->offset + t->numel : end;
        for (size_t i = lo; i < hi; i++)
            out[i - begin] = t->ndim == 1 ? 1.0f
                                          : (float)(cfg->init_std * rng_normal_at(key, i));
    }
    /* padding beyond the unit's tensors (FSDP shards) is zero */
    for (size_t i = (unit->numel > begin ? unit->numel : begin); i < end; i++) out[i - begin] = 0;
}

/* ------------------------------------------------------------------- model */

/* Saved activations of one transformer block (act dtype unless noted). */
typedef struct block_acts {
    void *ln1;   /* (N, d)   input_layernorm output */
    float *rstd1;/* (N)      */
    void *qkv;   /* (N, qkv) after RoPE */
    void *att;   /* (N, nh·hd) attention output, before o_proj */
    float *lse;  /* (B, nh, T) */
    void *xmid;  /* (N, d)   residual after attention */
    void *ln2;   /* (N, d)   */
    float *rstd2;/* (N)      */
    void *gu;    /* (N, 2F)  [gate | up] */
    void *h;     /* (N, F)   silu(gate)·up */
} block_acts;

struct llama_model {
    llama_config cfg;
    const shlm_ops *ops;
    llama_param_source src;
    llama_layout lay;
    int B, T;             /* capacity */
    size_t esz;           /* bytes per act element */
    int qkv_dim, att_dim; /* (nh+2nkv)·hd, nh·hd */
    void **x;             /* L+1 residual streams (N, d): x[0] embedding out, x[l+1] block l out */
    block_acts *acts;     /* L */
    void *lnf;            /* (N, d) final norm output */
    float *rstdf;         /* (N) */
    int chunk_rows;       /* rows of logits computed at once */
    void *logits;         /* (chunk_rows, V) */
    float *losses;        /* (N) */
    void *dx;             /* (N, d) gradient of the residual stream */
    void *dln;            /* (N, d) */
    void *dwide1;         /* (N, max(F, nh·hd)) */
    void *dwide2;         /* (N, max(2F, qkv)) */
    int32_t *tokens_dev, *targets_dev; /* (N) */
    size_t act_bytes;
};

static void *act_alloc(llama_model *m, size_t elems) {
    size_t bytes = elems * m->esz;
    m->act_bytes += bytes;
    return m->ops->alloc(bytes);
}

static float *f32_alloc(llama_model *m, size_t elems) {
    m->act_bytes += elems * sizeof(float);
    return m->ops->alloc(elems * sizeof(float));
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

llama_model *llama_create(const llama_config *cfg, const shlm_ops *ops, int B, int T,
                          llama_param_source src) {
    llama_model *m = calloc(1, sizeof *m);
    SHLM_CHECK_ALLOC(m);
    m->cfg = *cfg;
    m->ops = ops;
    m->src = src;
    m->B = B;
    m->T = T;
    m->esz = shlm_dtype_size(ops->act_dtype);
    llama_layout_init(&m->lay, cfg);
    const size_t N = (size_t)B * T, d = cfg->dim, F = cfg->ffn_dim, L = cfg->n_layers;
    m->qkv_dim = (cfg->n_heads + 2 * cfg->n_kv_heads) * cfg->head_dim;
    m->att_dim = cfg->n_heads * cfg->head_dim;
    m->x = calloc(L + 1, sizeof(void *));
    m->acts = calloc(L, sizeof(block_acts));
    SHLM_CHECK_ALLOC(m->x);
    SHLM_CHECK_ALLOC(m->acts);
    for (size_t l = 0; l <= L; l++) m->x[l] = act_alloc(m, N * d);
    for (size_t l = 0; l < L; l++) {
        block_acts *a = &m->acts[l];
        a->ln1 = act_alloc(m, N * d);
        a->rstd1 = f32_alloc(m, N);
        a->qkv = act_alloc(m, N * m->qkv_dim);
        a->att = act_alloc(m, N * m->att_dim);
        a->lse = f32_alloc(m, (size_t)B * cfg->n_heads * T);
        a->xmid = act_alloc(m, N * d);
        a->ln2 = act_alloc(m, N * d);
        a->rstd2 = f32_alloc(m, N);
        a->gu = act_alloc(m, N * 2 * F);
        a->h = act_alloc(m, N * F);
    }
    m->lnf = act_alloc(m, N * d);
    m->rstdf = f32_alloc(m, N);
    /* never hold the whole (N, V) logits: 16M elements per chunk at most */
    size_t rows = ((size_t)1 << 24) / (size_t)cfg->vocab_size;
    m->chunk_rows = (int)(rows < 1 ? 1 : rows > N ? N : rows);
    m->logits = act_alloc(m, (size_t)m->chunk_rows * cfg->vocab_size);
    m->losses = f32_alloc(m, N);
    m->dx = act_alloc(m, N * d);
    m->dln = act_alloc(m, N * d);
    m->dwide1 = act_alloc(m, N * max_sz(F, (size_t)m->att_dim));
    m->dwide2 = act_alloc(m, N * max_sz(2 * F, (size_t)m->qkv_dim));
    m->tokens_dev = ops->alloc(N * sizeof(int32_t));
    m->targets_dev = ops->alloc(N * sizeof(int32_t));
    m->act_bytes += 2 * N * sizeof(int32_t);
    return m;
}

void llama_destroy(llama_model *m) {
    if (!m) return;
    const shlm_ops *o = m->ops;
    for (int l = 0; l <= m->cfg.n_layers; l++) o->free(m->x[l]);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        block_acts *a = &m->acts[l];
        void *p[] = {a->ln1, a->rstd1, a->qkv, a->att, a->lse, a->xmid, a->ln2, a->rstd2, a->gu, a->h};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) o->free(p[i]);
    }
    void *p[] = {m->lnf, m->rstdf, m->logits, m->losses, m->dx, m->dln, m->dwide1, m->dwide2,
                 m->tokens_dev, m->targets_dev};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) o->free(p[i]);
    free(m->x);
    free(m->acts);
    llama_layout_free(&m->lay);
    free(m);
}

const llama_layout *llama_get_layout(const llama_model *m) { return &m->lay; }
size_t llama_activation_bytes(const llama_model *m) { return m->act_bytes; }

/* Pointer to tensor k of unit u inside a gathered (act dtype) unit buffer. */
static const void *wptr(const llama_model *m, const void *unit, int u, int k) {
    return (const char *)unit + m->lay.units[u].tensors[k].offset * m->esz;
}
/* Pointer to tensor k of unit u inside an fp32 gradient buffer. */
static float *gptr(const llama_model *m, float *grad, int u, int k) {
    return grad + m->lay.units[u].tensors[k].offset;
}

/* Tensor indices inside a block unit (see the layout comment in llama.h). */
enum { BK_LN1 = 0, BK_Q = 1, BK_O = 4, BK_LN2 = 5, BK_GATE = 6, BK_DOWN = 8 };
enum { HD_NORM = 0, HD_LM = 1 };

static void block_forward(llama_model *m, int l, const void *p, int B, int T) {
    const shlm_ops *o = m->ops;
    const llama_config *c = &m->cfg;
    const int u = llama_unit_block(l), N = B * T, d = c->dim, F = c->ffn_dim;
    block_acts *a = &m->acts[l];
    const void *x = m->x[l];
    void *xout = m->x[l + 1];
    o->rmsnorm_fwd(a->ln1, a->rstd1, x, wptr(m, p, u, BK_LN1), N, d, c->norm_eps);
    /* q, k, v are contiguous in the unit: one fused GEMM */
    o->matmul_fwd(a->qkv, a->ln1, wptr(m, p, u, BK_Q), N, d, m->qkv_dim, 0);
    o->rope(a->qkv, N, T, m->qkv_dim, c->n_heads + c->n_kv_heads, c->head_dim, c->rope_theta, 0);
    o->attention_fwd(a->att, a->lse, a->qkv, B, T, c->n_heads, c->n_kv_heads, c->head_dim);
    /* residual: xmid = x + att·Woᵀ, accumulated by the GEMM itself */
    o->copy(a->xmid, x, (size_t)N * d * m->esz);
    o->matmul_fwd(a->xmid, a->att, wptr(m, p, u, BK_O), N, m->att_dim, d, 1);
    o->rmsnorm_fwd(a->ln2, a->rstd2, a->xmid, wptr(m, p, u, BK_LN2), N, d, c->norm_eps);
    /* gate and up are contiguous: one fused GEMM into [gate | up] rows */
    o->matmul_fwd(a->gu, a->ln2, wptr(m, p, u, BK_GATE), N, d, 2 * F, 0);
    o->swiglu_fwd(a->h, a->gu, N, F);
    o->copy(xout, a->xmid, (size_t)N * d * m->esz);
    o->matmul_fwd(xout, a->h, wptr(m, p, u, BK_DOWN), N, F, d, 1);
}

/* m->dx holds dL/dx[l+1] on entry and dL/dx[l] on return. */
static void block_backward(llama_model *m, int l, const void *p, float *g, int B, int T) {
    const shlm_ops *o = m->ops;
    const llama_config *c = &m->cfg;
    const int u = llama_unit_block(l), N = B * T, d = c->dim, F = c->ffn_dim;
    block_acts *a = &m->acts[l];
    /* MLP: x[l+1] = xmid + h·Wdᵀ */
    void *dh = m->dwide1, *dgu = m->dwide2;
    o->zero(dh, (size_t)N * F * m->esz);
    o->matmul_bwd(dh, gptr(m, g, u, BK_DOWN), m->dx, a->h, wptr(m, p, u, BK_DOWN), N, F, d);
    o->swiglu_bwd(dgu, dh, a->gu, N, F);
    o->zero(m->dln, (size_t)N * d * m->esz);
    o->matmul_bwd(m->dln, gptr(m, g, u, BK_GATE), dgu, a->ln2, wptr(m, p, u, BK_GATE), N, d,
                  2 * F);
    o->rmsnorm_bwd(m->dx, gptr(m, g, u, BK_LN2), m->dln, a->xmid, wptr(m, p, u, BK_LN2),
                   a->rstd2, N, d);
    /* attention: xmid = x + att·Woᵀ */
    void *datt = m->dwide1, *dqkv = m->dwide2;
    o->zero(datt, (size_t)N * m->att_dim * m->esz);
    o->matmul_bwd(datt, gptr(m, g, u, BK_O), m->dx, a->att, wptr(m, p, u, BK_O), N, m->att_dim,
                  d);
    o->attention_bwd(dqkv, datt, a->qkv, a->att, a->lse, B, T, c->n_heads, c->n_kv_heads,
                     c->head_dim);
    /* the gradient w.r.t. the pre-RoPE q, k is the inverse rotation of the post-RoPE one */
    o->rope(dqkv, N, T, m->qkv_dim, c->n_heads + c->n_kv_heads, c->head_dim, c->rope_theta, 1);
    o->zero(m->dln, (size_t)N * d * m->esz);
    o->matmul_bwd(m->dln, gptr(m, g, u, BK_Q), dqkv, a->ln1, wptr(m, p, u, BK_Q), N, d,
                  m->qkv_dim);
    o->rmsnorm_bwd(m->dx, gptr(m, g, u, BK_LN1), m->dln, m->x[l], wptr(m, p, u, BK_LN1),
                   a->rstd1, N, d);
}

static void check_shape(const llama_model *m, int B, int T) {
    if (B < 1 || T < 1 || B > m->B || T > m->T)
        SHLM_FATAL("batch %dx%d exceeds the model's capacity %dx%d", B, T, m->B, m->T);
}

static int count_valid(const int32_t *targets, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) v += targets[i] >= 0;
    return v;
}

/* Embedding and every block forward; leaves x[L] filled. */
static void trunk_forward(llama_model *m, const int32_t *tokens, int B, int T) {
    const shlm_ops *o = m->ops;
    const int N = B * T;
    o->to_device(m->tokens_dev, tokens, (size_t)N * sizeof(int32_t));
    const void *p = m->src.acquire(m->src.ctx, LLAMA_UNIT_EMBED, LLAMA_FWD);
    o->embedding_fwd(m->x[0], m->tokens_dev, p, N, m->cfg.dim);
    m->src.release(m->src.ctx, LLAMA_UNIT_EMBED, LLAMA_FWD);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        int u = llama_unit_block(l);
        p = m->src.acquire(m->src.ctx, u, LLAMA_FWD);
        block_forward(m, l, p, B, T);
        m->src.release(m->src.ctx, u, LLAMA_FWD);
    }
}

/* Copies n act-dtype elements from the backend to host fp32. */
static void act_to_host_f32(llama_model *m, float *dst, const void *src, size_t n) {
    if (m->esz == sizeof(float)) {
        m->ops->to_host(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *tmp = malloc(n * m->esz);
    SHLM_CHECK_ALLOC(tmp);
    m->ops->to_host(tmp, src, n * m->esz);
    for (size_t i = 0; i < n; i++) { /* bf16 -> fp32 is exact: the high half of the bits */
        uint32_t bits = (uint32_t)tmp[i] << 16;
        memcpy(&dst[i], &bits, sizeof bits);
    }
    free(tmp);
}

static double sum_losses(llama_model *m, int N) {
    float *h = malloc((size_t)N * sizeof(float));
    SHLM_CHECK_ALLOC(h);
    m->ops->to_host(h, m->losses, (size_t)N * sizeof(float));
    double s = 0;
    for (int i = 0; i < N; i++) s += h[i];
    free(h);
    return s;
}

float llama_forward_backward(llama_model *m, const int32_t *tokens, const int32_t *targets,
                             int B, int T, float grad_scale, int *n_valid) {
    check_shape(m, B, T);
    const shlm_ops *o = m->ops;
    const llama_config *c = &m->cfg;
    const int N = B * T, d = c->dim, V = c->vocab_size, L = c->n_layers;
    const int valid = count_valid(targets, N);
    if (n_valid) *n_valid = valid;
    trunk_forward(m, tokens, B, T);
    o->to_device(m->targets_dev, targets, (size_t)N * sizeof(int32_t));

    /* head: final norm, then logits, loss and their gradient chunk by chunk, so the
     * (N, V) logits never exist whole; the head's backward runs right here */
    const int hu = llama_unit_head(c);
    const void *p = m->src.acquire(m->src.ctx, hu, LLAMA_FWD);
    float *g = m->src.grad(m->src.ctx, hu);
    o->rmsnorm_fwd(m->lnf, m->rstdf, m->x[L], wptr(m, p, hu, HD_NORM), N, d, c->norm_eps);
    const float dscale = valid > 0 ? grad_scale / (float)valid : 0.0f;
    o->zero(m->dln, (size_t)N * d * m->esz);
    for (int r0 = 0; r0 < N; r0 += m->chunk_rows) {
        int rows = N - r0 < m->chunk_rows ? N - r0 : m->chunk_rows;
        const void *lnf_r = (const char *)m->lnf + (size_t)r0 * d * m->esz;
        o->matmul_fwd(m->logits, lnf_r, wptr(m, p, hu, HD_LM), rows, d, V, 0);
        o->xent_fwd_bwd(m->losses + r0, m->logits, m->logits, m->targets_dev + r0, rows, V,
                        dscale);
        o->matmul_bwd((char *)m->dln + (size_t)r0 * d * m->esz, gptr(m, g, hu, HD_LM), m->logits,
                      lnf_r, wptr(m, p, hu, HD_LM), rows, d, V);
    }
    o->zero(m->dx, (size_t)N * d * m->esz);
    o->rmsnorm_bwd(m->dx, gptr(m, g, hu, HD_NORM), m->dln, m->x[L], wptr(m, p, hu, HD_NORM),
                   m->rstdf, N, d);
    m->src.release(m->src.ctx, hu, LLAMA_FWD);
    m->src.grad_ready(m->src.ctx, hu);
    double loss_sum = sum_losses(m, N);

    for (int l = L - 1; l >= 0; l--) {
        int u = llama_unit_block(l);
        p = m->src.acquire(m->src.ctx, u, LLAMA_BWD);
        g = m->src.grad(m->src.ctx, u);
        block_backward(m, l, p, g, B, T);
        m->src.release(m->src.ctx, u, LLAMA_BWD);
        m->src.grad_ready(m->src.ctx, u);
    }
    /* the embedding's backward needs no parameters, only the token ids */
    g = m->src.grad(m->src.ctx, LLAMA_UNIT_EMBED);
    o->embedding_bwd(g, m->dx, m->tokens_dev, N, d);
    m->src.grad_ready(m->src.ctx, LLAMA_UNIT_EMBED);
    return valid > 0 ? (float)(loss_sum / valid) : 0.0f;
}

float llama_forward(llama_model *m, const int32_t *tokens, const int32_t *targets, int B,
                    int T, int *n_valid, float *logits_out, float *last_logits_out) {
    check_shape(m, B, T);
    const shlm_ops *o = m->ops;
    const llama_config *c = &m->cfg;
    const int N = B * T, d = c->dim, V = c->vocab_size, L = c->n_layers;
    trunk_forward(m, tokens, B, T);
    const int hu = llama_unit_head(c);
    const void *p = m->src.acquire(m->src.ctx, hu, LLAMA_FWD);
    o->rmsnorm_fwd(m->lnf, m->rstdf, m->x[L], wptr(m, p, hu, HD_NORM), N, d, c->norm_eps);
    int valid = 0;
    double loss_sum = 0;
    if (targets || logits_out) {
        if (targets) o->to_device(m->targets_dev, targets, (size_t)N * sizeof(int32_t));
        for (int r0 = 0; r0 < N; r0 += m->chunk_rows) {
            int rows = N - r0 < m->chunk_rows ? N - r0 : m->chunk_rows;
            const void *lnf_r = (const char *)m->lnf + (size_t)r0 * d * m->esz;
            o->matmul_fwd(m->logits, lnf_r, wptr(m, p, hu, HD_LM), rows, d, V, 0);
            if (logits_out) act_to_host_f32(m, logits_out + (size_t)r0 * V, m->logits,
                                            (size_t)rows * V);
            if (targets)
                o->xent_fwd_bwd(m->losses + r0, NULL, m->logits, m->targets_dev + r0, rows, V,
                                0.0f);
        }
        if (targets) {
            valid = count_valid(targets, N);
            loss_sum = sum_losses(m, N);
        }
    }
    if (last_logits_out) {
        for (int b = 0; b < B; b++) {
            const void *row = (const char *)m->lnf + ((size_t)b * T + T - 1) * d * m->esz;
            o->matmul_fwd(m->logits, row, wptr(m, p, hu, HD_LM), 1, d, V, 0);
            act_to_host_f32(m, last_logits_out + (size_t)b * V, m->logits, (size_t)V);
        }
    }
    m->src.release(m->src.ctx, hu, LLAMA_FWD);
    if (n_valid) *n_valid = valid;
    return valid > 0 ? (float)(loss_sum / valid) : 0.0f;
}
