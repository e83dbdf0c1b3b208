/* The decoder (decoder.h) over the ops table: parameter layout and init, forward, fused
 * loss, and backward, one FSDP unit at a time through a param source. */
#include "src/model/decoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/check.h"
#include "src/model/fp8_linear.h"
#include "src/model/lora_linear.h"
#include "src/base/rng.h"

/* ------------------------------------------------------------------ layout */

/* Tensor indices inside a block unit (see the layout comment in decoder.h); BK_QB, the q
 * bias, starts the q|k|v biases of a shape with qkv_bias. */
enum { BK_LN1 = 0, BK_Q = 1, BK_O = 4, BK_LN2 = 5, BK_GATE = 6, BK_DOWN = 8, BK_QB = 9 };
/* The first tensor of each of a block's product weights, in the order of the layout's fp8
 * matrices: q|k|v, o, gate|up, down */
static const int fp8_first[MODEL_MAX_FP8_WEIGHTS] = {BK_Q, BK_O, BK_GATE, BK_DOWN};

static void add_tensor(model_unit *u, const char *name, int64_t rows, int64_t cols,
                       int decay, model_target target) {
    model_tensor *t = &u->tensors[u->n_tensors++];
    t->target = target;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 0;
    t->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    t->offset = u->numel;
    t->weight_decay = decay;
    u->numel += t->numel;
}

void decoder_layout(const decoder_config *c, model_layout *lay) {
    int64_t d = c->dim, hd = c->head_dim, F = c->ffn_dim, V = c->vocab_size;
    const int tied = c->tie_word_embeddings != 0;
    lay->n_units = c->n_layers + 2 - tied;
    lay->units = calloc((size_t)lay->n_units, sizeof(model_unit));
    SHLM_CHECK_ALLOC(lay->units);
    for (int u = 0; u < lay->n_units; u++) lay->units[u].grad_writes = 1;
    add_tensor(&lay->units[DECODER_UNIT_EMBED], "model.embed_tokens.weight", V, d, 1,
               MODEL_TARGET_NONE);
    char name[96];
    for (int l = 0; l < c->n_layers; l++) {
        model_unit *u = &lay->units[decoder_unit_block(l)];
#define T_(suffix, rows, cols, decay, target)                                 \
    do {                                                                      \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);         \
        add_tensor(u, name, rows, cols, decay, target);                       \
    } while (0)
        T_("input_layernorm.weight", d, 0, 0, MODEL_TARGET_NONE);
        T_("self_attn.q_proj.weight", c->n_heads * hd, d, 1, MODEL_TARGET_Q);
        T_("self_attn.k_proj.weight", c->n_kv_heads * hd, d, 1, MODEL_TARGET_K);
        T_("self_attn.v_proj.weight", c->n_kv_heads * hd, d, 1, MODEL_TARGET_V);
        T_("self_attn.o_proj.weight", d, c->n_heads * hd, 1, MODEL_TARGET_O);
        T_("post_attention_layernorm.weight", d, 0, 0, MODEL_TARGET_NONE);
        T_("mlp.gate_proj.weight", F, d, 1, MODEL_TARGET_GATE);
        T_("mlp.up_proj.weight", F, d, 1, MODEL_TARGET_UP);
        T_("mlp.down_proj.weight", d, F, 1, MODEL_TARGET_DOWN);
        if (c->qkv_bias) {
            T_("self_attn.q_proj.bias", c->n_heads * hd, 0, 0, MODEL_TARGET_NONE);
            T_("self_attn.k_proj.bias", c->n_kv_heads * hd, 0, 0, MODEL_TARGET_NONE);
            T_("self_attn.v_proj.bias", c->n_kv_heads * hd, 0, 0, MODEL_TARGET_NONE);
        }
#undef T_
        /* the products' weights, q|k|v and gate|up fused as the products read them */
        const int64_t qkv = (c->n_heads + 2 * c->n_kv_heads) * hd, att = c->n_heads * hd;
        const int64_t shape[MODEL_MAX_FP8_WEIGHTS][2] = {{qkv, d}, {d, att}, {2 * F, d}, {d, F}};
        for (int k = 0; k < MODEL_MAX_FP8_WEIGHTS; k++)
            u->fp8[u->n_fp8++] = (model_fp8_weight){u->tensors[fp8_first[k]].offset,
                                                    (int)shape[k][0], (int)shape[k][1]};
    }
    /* tied: the head is the embedding's unit (its tensor 0 is the output projection) */
    model_unit *h = &lay->units[decoder_unit_head(c)];
    add_tensor(h, "model.norm.weight", d, 0, 0, MODEL_TARGET_NONE);
    if (tied) h->grad_writes = 2;
    else add_tensor(h, "lm_head.weight", V, d, 1, MODEL_TARGET_NONE);
    lay->total_numel = 0;
    for (int u = 0; u < lay->n_units; u++) lay->total_numel += lay->units[u].numel;
}

static uint64_t init_count; /* called from one thread: the loop inside is the parallel part */

uint64_t decoder_init_count(void) { return init_count; }

/* The value every element of 1-D tensor k of unit u starts at: 0 for a bias (as Hugging
 * Face initialises nn.Linear biases), 1 for a norm weight. */
static float init_1d(const decoder_config *cfg, int u, int k) {
    const int block = u >= decoder_unit_block(0) && u < decoder_unit_block(cfg->n_layers);
    return block && k >= BK_QB ? 0.0f : 1.0f;
}

static void init_slice(const model_layout *lay, const decoder_config *cfg, uint64_t seed, int u,
                       size_t begin, size_t end, float *out) {
    const model_unit *unit = &lay->units[u];
    init_count += end > begin ? end - begin : 0;
    /* one independent stream per unit: element i of unit u depends only on (seed,u,i) */
    uint64_t key = rng_hash64(seed ^ rng_hash64(0x11a3a000ull + (uint64_t)u));
    for (int k = 0; k < unit->n_tensors; k++) {
        const model_tensor *t = &unit->tensors[k];
        size_t lo = t->offset > begin ? t->offset : begin;
        size_t hi = t->offset + t->numel < end ? t->offset + t->numel : end;
        const float one_d = init_1d(cfg, u, k);
        /* a pure function of the index: threads split it freely (7B on one rank is 7e9 draws) */
#pragma omp parallel for schedule(static)
        for (size_t i = lo; i < hi; i++)
            out[i - begin] = t->ndim == 1 ? one_d
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
    /* FP8 recipes keeping activations: ln1, ln2 and h are only ever matmul inputs, so the
     * block keeps their quantized transposes (wgrad's q(xᵀ)) instead of them */
    shlm_fp8_matrix ln1_t; /* (d, N)  */
    shlm_fp8_matrix ln2_t; /* (d, N)  */
    shlm_fp8_matrix h_t;   /* (F, N)  */
} block_acts;

struct decoder {
    decoder_config cfg;
    const shlm_ops *ops;
    model_param_source src;
    model_layout lay;
    int B, T;             /* capacity */
    model_ac ac;          /* activation checkpointing mode */
    model_matmul matmul;  /* the blocks' linear layers: act dtype, or FP8 through fp8 */
    fp8_linear fp8;       /* FP8's formats and operand buffers (recipes other than bf16) */
    int lora_on;          /* LoRA: the parameters are frozen, the products' adapters train */
    int eager_decode;     /* model_opts.eager_decode */
    lora_linear lora;     /* the adapters' buffers and arithmetic (lora_on) */
    float *sink;          /* (d) LoRA: where a frozen norm's weight gradient goes, unread */
    int profile;          /* time every op (decoder_set_profile) */
    double prof_s[DECODER_PROF_N];
    size_t esz;           /* bytes per act element */
    int qkv_dim, att_dim; /* (nh+2nkv)·hd, nh·hd */
    shlm_rope rope;       /* RoPE's frequencies, made once from the config */
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
    int32_t *doc_dev;     /* (N) the batch's doc_start (ops.h attention), uploaded per pass */
    const int32_t *doc;   /* this pass's doc_start: doc_dev, or NULL for the causal mask */
    size_t act_bytes;
    int head;             /* the unit of the final norm and the output projection */
    int head_norm;        /* model.norm.weight's index among that unit's tensors */
    int head_out;         /* the output projection's (lm_head, or the tied embedding) */
};

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Every activation buffer of a model, in one list, so allocation, freeing and the
 * plan's byte count come from the same description. `per_layer` buffers exist once
 * per block when kept for the backward, once in all (scratch) when recomputed. */
typedef enum buf_kind { BUF_ACT, BUF_F32, BUF_I32, BUF_U8 } buf_kind;

typedef struct act_sizes {
    size_t N, d, F, qkv, att, lse, chunk_rows, V;
} act_sizes;

static act_sizes sizes_of(const decoder_config *c, int B, int T) {
    act_sizes z;
    z.N = (size_t)B * T;
    z.d = c->dim;
    z.F = c->ffn_dim;
    z.qkv = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    z.att = (size_t)c->n_heads * c->head_dim;
    z.lse = (size_t)B * c->n_heads * T;
    z.V = c->vocab_size;
    /* never hold the whole (N, V) logits: 64M elements per chunk at most (128 MB in
     * bf16; fewer chunks mean fewer passes over the fp32 lm_head gradient) */
    size_t rows = ((size_t)1 << 26) / z.V;
    z.chunk_rows = rows < 1 ? 1 : rows > z.N ? z.N : rows;
    return z;
}

/* Which block_acts fields a mode keeps per layer (1) or recomputes in scratch (0). */
typedef struct keep_set { int ln1, rstd1, qkv, att, lse, xmid, ln2, rstd2, gu, h; } keep_set;

static keep_set kept_by(model_ac ac) {
    switch (ac) {
    case MODEL_AC_FULL: return (keep_set){0};
    case MODEL_AC_SELECTIVE: return (keep_set){.qkv = 1, .xmid = 1, .gu = 1};
    default: return (keep_set){1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    }
}

/* What a mode keeps under a matmul recipe: FP8 keeps the quantized transposes of ln1, ln2
 * and h where the mode keeps them (*quantized = 1), and the tensors themselves become
 * scratch. With LoRA (lora) nothing computes a base weight's gradient, the only use of
 * those transposes, and the adapters read ln1, ln2 and h themselves: they stay. */
static keep_set kept_for(model_ac ac, model_matmul mm, int lora, int *quantized) {
    keep_set k = kept_by(ac);
    *quantized = mm != MODEL_MATMUL_BF16 && !lora && k.ln1 && k.ln2 && k.h;
    if (*quantized) k.ln1 = k.ln2 = k.h = 0;
    return k;
}

/* What a walk over the buffers counts: bytes, each buffer rounded up to align. */
typedef struct buf_count {
    size_t bytes, align;
} buf_count;

/* Allocation (when m != NULL) or counting (m == NULL) of one buffer. */
static void *buf(decoder *m, buf_count *n, size_t esz, buf_kind k, size_t elems) {
    size_t b = elems * (k == BUF_ACT ? esz : k == BUF_U8 ? 1 : 4);
    n->bytes += (b + n->align - 1) / n->align * n->align;
    return m ? m->ops->alloc(b) : NULL;
}

/* Walks every buffer of the model: allocates into m, or only counts (m == NULL). lora:
 * the adapters' configuration, or NULL. */
static buf_count layout_acts(decoder *m, const decoder_config *c, size_t esz, int B, int T,
                             model_ac ac, model_matmul mm, const lora_config *lora,
                             size_t align) {
    const act_sizes z = sizes_of(c, B, T);
    const size_t L = (size_t)c->n_layers, N = z.N;
    int quantized;
    const keep_set keep = kept_for(ac, mm, lora != NULL, &quantized);
    buf_count bytes = {0, align > 0 ? align : 1};
    block_acts scratch = {0};
#define FIELD(name, kind, elems)                                                      \
    do {                                                                              \
        if (!keep.name) scratch.name = buf(m, &bytes, esz, kind, elems);              \
        for (size_t l = 0; l < L; l++) {                                              \
            void *p_ = keep.name ? buf(m, &bytes, esz, kind, elems) : scratch.name;   \
            if (m) m->acts[l].name = p_;                                              \
        }                                                                             \
    } while (0)
    FIELD(ln1, BUF_ACT, N * z.d);
    FIELD(rstd1, BUF_F32, N);
    FIELD(qkv, BUF_ACT, N * z.qkv);
    FIELD(att, BUF_ACT, N * z.att);
    FIELD(lse, BUF_F32, z.lse);
    FIELD(xmid, BUF_ACT, N * z.d);
    FIELD(ln2, BUF_ACT, N * z.d);
    FIELD(rstd2, BUF_F32, N);
    FIELD(gu, BUF_ACT, N * 2 * z.F);
    FIELD(h, BUF_ACT, N * z.F);
#undef FIELD
    /* codes and one scale per row (rowwise; tensorwise uses the first) of each transpose */
#define KEPT_T(name, C)                                                               \
    do {                                                                              \
        for (size_t l = 0; quantized && l < L; l++) {                                 \
            void *codes_ = buf(m, &bytes, esz, BUF_U8, (C) * N);                      \
            void *scales_ = buf(m, &bytes, esz, BUF_F32, (C));                        \
            if (m) m->acts[l].name = (shlm_fp8_matrix){codes_, scales_, (int)(C), (int)N, \
                                                       SHLM_FP8_E4M3, m->fp8.scaling}; \
        }                                                                             \
    } while (0)
    KEPT_T(ln1_t, z.d);
    KEPT_T(ln2_t, z.d);
    KEPT_T(h_t, z.F);
#undef KEPT_T
    for (size_t l = 0; l <= L; l++) {
        void *p = buf(m, &bytes, esz, BUF_ACT, N * z.d);
        if (m) m->x[l] = p;
    }
#define ONE(field, kind, elems)                             \
    do {                                                    \
        void *p_ = buf(m, &bytes, esz, kind, elems);        \
        if (m) m->field = p_;                               \
    } while (0)
    ONE(lnf, BUF_ACT, N * z.d);
    ONE(rstdf, BUF_F32, N);
    ONE(logits, BUF_ACT, z.chunk_rows * z.V);
    ONE(losses, BUF_F32, N);
    ONE(dx, BUF_ACT, N * z.d);
    ONE(dln, BUF_ACT, N * z.d);
    ONE(dwide1, BUF_ACT, N * max_sz(z.F, z.att));
    ONE(dwide2, BUF_ACT, N * max_sz(2 * z.F, z.qkv));
    ONE(tokens_dev, BUF_I32, N);
    ONE(targets_dev, BUF_I32, N);
    ONE(doc_dev, BUF_I32, N);
    if (mm != MODEL_MATMUL_BF16) {
        /* the linears (C, OC): qkv (d, qkv), o (att, d), gate|up (d, 2F), down (F, d) */
        const size_t width = max_sz(max_sz(z.d, z.qkv), max_sz(z.att, 2 * z.F));
        const size_t weight = max_sz(max_sz(z.qkv * z.d, z.d * z.att), 2 * z.F * z.d);
        const size_t in = max_sz(z.d, max_sz(z.att, z.F));
        const fp8_linear_sizes fz = fp8_linear_sizes_for(N, width, weight, in);
        ONE(fp8.a_codes, BUF_U8, fz.a_codes);
        ONE(fp8.a_scales, BUF_F32, fz.a_scales);
        ONE(fp8.b_codes, BUF_U8, fz.b_codes);
        ONE(fp8.b_scales, BUF_F32, fz.b_scales);
        ONE(fp8.t_codes, BUF_U8, fz.t_codes);
        ONE(fp8.t_scales, BUF_F32, fz.t_scales);
        if (mm == MODEL_MATMUL_FP8_TENSORWISE) ONE(fp8.src_amax, BUF_F32, 1);
    }
    if (lora) { /* the adapters' buffers (lora_linear.h), kept unless blocks are recomputed */
        ONE(sink, BUF_F32, z.d);
        model_layout lay;
        if (!m) decoder_layout(c, &lay);
        bytes.bytes += lora_linear_init(m ? &m->lora : NULL, m ? m->ops : NULL,
                                        m ? &m->lay : &lay, lora, decoder_unit_block(0),
                                        c->n_layers, B, T, ac != MODEL_AC_FULL, esz, bytes.align);
        if (!m) model_layout_free(&lay);
    }
#undef ONE
    return bytes;
}

/* ---- the engine's side (src/engine/model.h): what the engine and the shard plan know ---- */

static void spec_layout(const void *cfg, model_layout *out) { decoder_layout(cfg, out); }

/* The acquires decoder_forward_backward and decoder_forward make: the embedding, the blocks
 * in order, the head (unit 0 again when tied), then in training the blocks' backwards in
 * reverse (the embedding's backward needs only the token ids). */
static void spec_pass(const void *cfg, const model_layout *lay, int with_backward,
                        model_pass *out) {
    const decoder_config *c = cfg;
    (void)lay;
    const int L = c->n_layers;
    out->n = 0;
    out->uses = malloc((size_t)(2 * L + 2) * sizeof *out->uses);
    SHLM_CHECK_ALLOC(out->uses);
    out->uses[out->n++] = (model_use){DECODER_UNIT_EMBED, MODEL_FWD};
    for (int l = 0; l < L; l++) out->uses[out->n++] = (model_use){decoder_unit_block(l), MODEL_FWD};
    out->uses[out->n++] = (model_use){decoder_unit_head(c), MODEL_HEAD};
    if (with_backward)
        for (int l = L - 1; l >= 0; l--)
            out->uses[out->n++] = (model_use){decoder_unit_block(l), MODEL_BWD};
}

static void spec_init_slice(const model_layout *lay, const void *cfg, uint64_t seed, int u,
                              size_t begin, size_t end, float *out) {
    init_slice(lay, cfg, seed, u, begin, end, out);
}

static size_t spec_activation_bytes(const void *cfg, shlm_dtype act, int B, int T,
                                      model_ac ac, model_matmul mm, const lora_config *lora,
                                      size_t align) {
    return layout_acts(NULL, cfg, shlm_dtype_size(act), B, T, ac, mm, lora, align).bytes;
}

static size_t spec_op_scratch_bytes(const void *cfg, const shlm_ops *ops, int B, int T) {
    const decoder_config *c = cfg;
    if (!ops || !ops->scratch_bytes) return 0;
    return ops->scratch_bytes(B, T, c->dim, c->n_heads, c->n_kv_heads, c->head_dim);
}

const model_spec decoder_spec = {
    .name = "decoder",
    .layout = spec_layout,
    .pass = spec_pass,
    .init_slice = spec_init_slice,
    .activation_bytes = spec_activation_bytes,
    .op_scratch_bytes = spec_op_scratch_bytes,
    .generator_bytes = decoder_generator_bytes,
};

decoder *decoder_create(const decoder_config *cfg, const shlm_ops *ops, int B, int T,
                        const model_opts *o, model_param_source src) {
    const model_ac ac = o->ac;
    const model_matmul matmul = o->matmul;
    decoder *m = calloc(1, sizeof *m);
    SHLM_CHECK_ALLOC(m);
    m->cfg = *cfg;
    m->ops = ops;
    m->src = src;
    m->B = B;
    m->T = T;
    m->ac = ac;
    m->matmul = matmul;
    m->fp8.ops = ops;
    m->fp8.fast_accum = o->fp8_fast_accum != 0;
    /* model_create checked that ops run the recipe (model_check_opts) */
    if (matmul != MODEL_MATMUL_BF16 &&
        fp8_linear_recipe(matmul, &m->fp8.scaling, &m->fp8.grad_format) != 0)
        SHLM_FATAL("decoder_create: unknown matmul recipe %d", (int)matmul);
    m->esz = shlm_dtype_size(ops->act_dtype);
    decoder_layout(cfg, &m->lay);
    m->qkv_dim = (cfg->n_heads + 2 * cfg->n_kv_heads) * cfg->head_dim;
    m->att_dim = cfg->n_heads * cfg->head_dim;
    char why[256];
    const shlm_rope_params rp = decoder_rope_params(cfg);
    if (shlm_rope_init(&m->rope, cfg->head_dim, &rp, why, sizeof why) != 0) SHLM_FATAL("%s", why);
    m->chunk_rows = (int)sizes_of(cfg, B, T).chunk_rows;
    m->x = calloc((size_t)cfg->n_layers + 1, sizeof(void *));
    m->acts = calloc((size_t)cfg->n_layers, sizeof(block_acts));
    SHLM_CHECK_ALLOC(m->x);
    SHLM_CHECK_ALLOC(m->acts);
    m->head = decoder_unit_head(cfg);
    m->head_norm = cfg->tie_word_embeddings ? 1 : 0; /* tied: after embed_tokens */
    m->head_out = cfg->tie_word_embeddings ? 0 : 1;
    m->lora_on = o->lora.rank > 0;
    m->eager_decode = o->eager_decode;
    m->act_bytes = layout_acts(m, cfg, m->esz, B, T, ac, m->matmul, m->lora_on ? &o->lora : NULL,
                               1).bytes;
    return m;
}

void decoder_destroy(decoder *m) {
    if (!m) return;
    const shlm_ops *o = m->ops;
    int quantized;
    const keep_set keep = kept_for(m->ac, m->matmul, m->lora_on, &quantized);
    const int L = m->cfg.n_layers;
    lora_linear_free(&m->lora);
    o->free(m->sink);
    for (int l = 0; quantized && l < L; l++) {
        shlm_fp8_matrix *t[] = {&m->acts[l].ln1_t, &m->acts[l].ln2_t, &m->acts[l].h_t};
        for (int k = 0; k < 3; k++) {
            o->free(t[k]->codes);
            o->free(t[k]->scale_inv);
        }
    }
    for (int l = 0; l <= L; l++) o->free(m->x[l]);
#define FIELD(name)                                                     \
    do {                                                                \
        if (keep.name) for (int l = 0; l < L; l++) o->free(m->acts[l].name); \
        else if (L > 0) o->free(m->acts[0].name);                       \
    } while (0)
    FIELD(ln1); FIELD(rstd1); FIELD(qkv); FIELD(att); FIELD(lse);
    FIELD(xmid); FIELD(ln2); FIELD(rstd2); FIELD(gu); FIELD(h);
#undef FIELD
    void *p[] = {m->lnf, m->rstdf, m->logits, m->losses, m->dx, m->dln, m->dwide1, m->dwide2,
                 m->tokens_dev, m->targets_dev, m->doc_dev, m->fp8.a_codes, m->fp8.a_scales,
                 m->fp8.b_codes, m->fp8.b_scales, m->fp8.t_codes, m->fp8.t_scales,
                 m->fp8.src_amax};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) o->free(p[i]);
    free(m->x);
    free(m->acts);
    model_layout_free(&m->lay);
    free(m);
}

const model_layout *decoder_get_layout(const decoder *m) { return &m->lay; }
size_t decoder_activation_bytes(const decoder *m) { return m->act_bytes; }

/* Pointer to tensor k of unit u inside a gathered (act dtype) unit buffer. */
static const void *wptr(const decoder *m, const void *unit, int u, int k) {
    return (const char *)unit + m->lay.units[u].tensors[k].offset * m->esz;
}
/* Pointer to tensor k of unit u inside an fp32 gradient buffer. */
static float *gptr(const decoder *m, float *grad, int u, int k) {
    return grad + m->lay.units[u].tensors[k].offset;
}

/* ---- profile mode: every op timed with a synchronisation on each side (slows the
 * step, attributes it). Categories as in decoder_prof_names. ---- */
static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
#define PROF(m, cat, call)                                           \
    do {                                                             \
        double prof_t0_ = 0;                                         \
        if ((m)->profile) {                                          \
            (m)->ops->sync();                                        \
            prof_t0_ = prof_now();                                   \
        }                                                            \
        call;                                                        \
        if ((m)->profile) {                                          \
            (m)->ops->sync();                                        \
            (m)->prof_s[cat] += prof_now() - prof_t0_;               \
        }                                                            \
    } while (0)

void decoder_set_profile(decoder *m, int on) { m->profile = on; }

void decoder_take_profile(decoder *m, double *seconds) {
    for (int k = 0; k < DECODER_PROF_N; k++) {
        seconds[k] = m->prof_s[k];
        m->prof_s[k] = 0;
    }
}

const char *const decoder_prof_names[DECODER_PROF_N] = {
    "matmul fwd", "matmul bwd", "attention fwd", "attention bwd", "rmsnorm", "rope",
    "swiglu", "copy/zero", "loss", "embedding", "engine (gather waits, grad slots)"};

/* Lets the engine's collectives in flight advance between ops. */
static void progress(const decoder *m) {
    if (m->src.progress) m->src.progress(m->src.ctx);
}

/* Where the op producing a linear's operand is to leave the operand's amax (ops.h
 * rmsnorm_fwd's amax), zeroed: the recipe's one float when it is tensorwise and the linear
 * will quantize the operand in both layouts (the forward keeping q(inpᵀ), the backward's
 * two products: where fp8_linear uses it), else NULL (nothing to compute). */
static float *operand_amax(const decoder *m, int both_layouts) {
    float *a = m->fp8.src_amax;
    if (!a || !both_layouts) return NULL;
    m->ops->zero(a, sizeof(float));
    return a;
}

/* A block's linear layer in the model's recipe: matmul_fwd / matmul_bwd's contract.
 * keep_t: the block's matrix for q(inpᵀ) (an FP8 recipe keeping activations: filled for
 * the backward), or a matrix without codes. inp_amax: operand_amax's, or NULL. */
static void linear_fwd(const decoder *m, void *out, const void *inp, fp8_linear_weight w,
                       int N, int C, int OC, const void *residual, shlm_fp8_matrix *keep_t,
                       const float *inp_amax) {
    if (m->matmul == MODEL_MATMUL_BF16) {
        m->ops->matmul_fwd(out, inp, w.w, N, C, OC, residual);
        return;
    }
    if (keep_t->codes) keep_t->cols = N;
    fp8_linear_fwd(&m->fp8, out, inp, w, N, C, OC, residual, keep_t->codes ? keep_t : NULL,
                   inp_amax);
}
/* inp_t: the block's kept q(inpᵀ) (an FP8 recipe keeping activations), or a matrix
 * without codes: quantize inp. dout_amax: operand_amax's, or NULL. */
static void linear_bwd(const decoder *m, void *dinp, float *dw, const void *dout,
                       const void *inp, const shlm_fp8_matrix *inp_t, fp8_linear_weight w,
                       int N, int C, int OC, int flags, const float *dout_amax) {
    if (m->matmul == MODEL_MATMUL_BF16) m->ops->matmul_bwd(dinp, dw, dout, inp, w.w, N, C, OC, flags);
    else fp8_linear_bwd(&m->fp8, dinp, dw, dout, inp, inp_t->codes ? inp_t : NULL, w, N, C, OC,
                        flags, dout_amax);
}
/* Block unit u's product weight starting at tensor k (one of fp8_first) of the acquired p,
 * with its FP8 codes when the source makes them. */
static fp8_linear_weight weight(const decoder *m, const void *p, int u, int k) {
    int j = 0;
    while (fp8_first[j] != k) j++;
    const shlm_fp8_matrix *w8 = NULL;
    if (m->matmul != MODEL_MATMUL_BF16 && m->src.fp8_weight) w8 = m->src.fp8_weight(m->src.ctx, u, j);
    return (fp8_linear_weight){wptr(m, p, u, k), w8};
}

/* att is attention's backward input too, so kept itself: its transpose is made when needed */
static shlm_fp8_matrix no_transpose = {0};

/* Product k (fp8_first's order: q|k|v, o, gate|up, down) of block l: linear_fwd, then its
 * LoRA adapters where it has them (lora_linear.h; DoRA's base product goes to its own
 * buffer, without the residual). ap: the block's gathered adapters. */
static void product_fwd(decoder *m, int l, int k, const void *p, const void *ap, void *out,
                        const void *inp, int N, int T, int C, int OC, const void *residual,
                        shlm_fp8_matrix *keep_t, const float *amax) {
    const int u = decoder_unit_block(l);
    const fp8_linear_weight w = weight(m, p, u, fp8_first[k]);
    if (!m->lora_on || !lora_linear_on(&m->lora, l, k)) {
        linear_fwd(m, out, inp, w, N, C, OC, residual, keep_t, amax);
        return;
    }
    void *base = lora_linear_base_out(&m->lora, l, k);
    linear_fwd(m, base ? base : out, inp, w, N, C, OC, base ? NULL : residual, keep_t, amax);
    lora_linear_fwd(&m->lora, l, k, w.w, ap, out, inp, N, T, residual);
}

/* Product k's backward: linear_bwd (dw NULL: a frozen weight's gradient is not computed),
 * around LoRA's where the product has adapters (ag: the block's adapter gradient, "=" when
 * ag_set). dout_writable: dout is this backward's scratch, which DoRA may scale in place. */
static void product_bwd(decoder *m, int l, int k, const void *p, const void *ap, float *ag,
                        int ag_set, void *dinp, float *dw, void *dout, int dout_writable,
                        const void *inp, const shlm_fp8_matrix *inp_t, int N, int T, int C,
                        int OC, int flags, const float *dout_amax) {
    const int u = decoder_unit_block(l);
    const fp8_linear_weight w = weight(m, p, u, fp8_first[k]);
    if (!m->lora_on || !lora_linear_on(&m->lora, l, k)) {
        linear_bwd(m, dinp, dw, dout, inp, inp_t, w, N, C, OC, flags, dout_amax);
        return;
    }
    const void *dy = lora_linear_bwd_dout(&m->lora, l, k, ap, ag, ag_set, dout, dout_writable, N);
    linear_bwd(m, dinp, dw, dy, inp, inp_t, w, N, C, OC, flags, dy == dout ? dout_amax : NULL);
    lora_linear_bwd(&m->lora, l, k, ap, ag, ag_set, dinp, dy, inp, N, T);
}

/* Names a profiler range after a unit: "fwd block 3". */
static void range_unit(const decoder *m, const char *what, int l) {
    if (!m->ops->range_push) return;
    char name[48];
    snprintf(name, sizeof name, "%s block %d", what, l);
    m->ops->range_push(name);
}

static void block_forward(decoder *m, int l, const void *p, const void *ap, int B, int T,
                          int write_out) {
    const shlm_ops *o = m->ops;
    const decoder_config *c = &m->cfg;
    const int u = decoder_unit_block(l), N = B * T, d = c->dim, F = c->ffn_dim;
    block_acts *a = &m->acts[l];
    const void *x = m->x[l];
    void *xout = m->x[l + 1];
    /* the norms and SwiGLU make the amax of the FP8 operand they write (operand_amax) */
    float *amax = operand_amax(m, a->ln1_t.codes != NULL);
    PROF(m, PROF_NORM, o->rmsnorm_fwd(a->ln1, a->rstd1, x, wptr(m, p, u, BK_LN1), N, d, c->norm_eps, amax));
    /* q, k, v are contiguous in the unit: one fused GEMM */
    PROF(m, PROF_MATMUL_FWD, product_fwd(m, l, 0, p, ap, a->qkv, a->ln1, N, T, d, m->qkv_dim, NULL, &a->ln1_t, amax));
    /* the q|k|v biases, in act dtype after the product whatever its recipe, before RoPE */
    if (c->qkv_bias) PROF(m, PROF_MATMUL_FWD, o->bias_add(a->qkv, wptr(m, p, u, BK_QB), N, m->qkv_dim));
    progress(m);
    PROF(m, PROF_ROPE, o->rope(a->qkv, N, T, m->qkv_dim, c->n_heads + c->n_kv_heads, &m->rope, NULL, 0));
    PROF(m, PROF_ATTN_FWD, o->attention_fwd(a->att, a->lse, a->qkv, m->doc, B, T, c->n_heads, c->n_kv_heads, c->head_dim));
    progress(m);
    /* residual: xmid = x + att·Woᵀ, added by the GEMM itself */
    PROF(m, PROF_MATMUL_FWD, product_fwd(m, l, 1, p, ap, a->xmid, a->att, N, T, m->att_dim, d, x, &no_transpose, NULL));
    progress(m);
    amax = operand_amax(m, a->ln2_t.codes != NULL);
    PROF(m, PROF_NORM, o->rmsnorm_fwd(a->ln2, a->rstd2, a->xmid, wptr(m, p, u, BK_LN2), N, d, c->norm_eps, amax));
    /* gate and up are contiguous: one fused GEMM into [gate | up] rows */
    PROF(m, PROF_MATMUL_FWD, product_fwd(m, l, 2, p, ap, a->gu, a->ln2, N, T, d, 2 * F, NULL, &a->ln2_t, amax));
    progress(m);
    /* recomputation for the backward (!write_out): x[l+1] is not needed, nor h's amax */
    amax = operand_amax(m, write_out && a->h_t.codes != NULL);
    PROF(m, PROF_SWIGLU, o->swiglu_fwd(a->h, a->gu, N, F, amax));
    /* the down product's adapters keep what their backward reads: recomputed with it */
    if (!write_out && !(m->lora_on && lora_linear_on(&m->lora, l, 3))) return;
    PROF(m, PROF_MATMUL_FWD, product_fwd(m, l, 3, p, ap, xout, a->h, N, T, F, d, a->xmid, &a->h_t, amax));
    progress(m);
}

/* Restores what the checkpointing mode did not keep of block l's activations. */
static void recompute(decoder *m, int l, const void *p, const void *ap, int B, int T) {
    const shlm_ops *o = m->ops;
    const decoder_config *c = &m->cfg;
    const int u = decoder_unit_block(l), N = B * T, d = c->dim;
    block_acts *a = &m->acts[l];
    if (m->ac == MODEL_AC_FULL) {
        block_forward(m, l, p, ap, B, T, 0);
    } else if (m->ac == MODEL_AC_SELECTIVE) {
        PROF(m, PROF_NORM, o->rmsnorm_fwd(a->ln1, a->rstd1, m->x[l], wptr(m, p, u, BK_LN1), N, d, c->norm_eps, NULL));
        PROF(m, PROF_ATTN_FWD, o->attention_fwd(a->att, a->lse, a->qkv, m->doc, B, T, c->n_heads, c->n_kv_heads, c->head_dim));
        PROF(m, PROF_NORM, o->rmsnorm_fwd(a->ln2, a->rstd2, a->xmid, wptr(m, p, u, BK_LN2), N, d, c->norm_eps, NULL));
        PROF(m, PROF_SWIGLU, o->swiglu_fwd(a->h, a->gu, N, c->ffn_dim, NULL));
    }
}

/* m->dx holds dL/dx[l+1] on entry and dL/dx[l] on return. g_set: the unit's gradient
 * buffer holds nothing to keep (the source said so), so every tensor of it is written
 * once with "=" instead of added to. The activation gradients (dh, dln, datt) are
 * always written with "=": no zeroing pass before each product. With LoRA, g is the
 * block's adapter gradient (ap its gathered adapters): the block's own weights are frozen,
 * their gradients never computed (the norms' go to the unread sink). */
static void block_backward(decoder *m, int l, const void *p, const void *ap, float *g,
                           int g_set, int B, int T) {
    const shlm_ops *o = m->ops;
    const decoder_config *c = &m->cfg;
    const int u = decoder_unit_block(l), N = B * T, d = c->dim, F = c->ffn_dim;
    const int lo = m->lora_on;
    const int mm = SHLM_MM_SET_DINP | (g_set && !lo ? SHLM_MM_SET_DWEIGHT : 0);
    float *ag = lo ? g : NULL;
#define BASE_G(k) (lo ? NULL : gptr(m, g, u, k))
#define NORM_G(k) (lo ? m->sink : gptr(m, g, u, k))
    block_acts *a = &m->acts[l];
    recompute(m, l, p, ap, B, T);
    if (g_set && !lo) { /* the norms' weight gradients are sums (+=): start them at zero */
        PROF(m, PROF_COPY, o->zero(gptr(m, g, u, BK_LN1), (size_t)d * sizeof(float)));
        PROF(m, PROF_COPY, o->zero(gptr(m, g, u, BK_LN2), (size_t)d * sizeof(float)));
    }
    /* MLP: x[l+1] = xmid + h·Wdᵀ */
    void *dh = m->dwide1, *dgu = m->dwide2;
    PROF(m, PROF_MATMUL_BWD, product_bwd(m, l, 3, p, ap, ag, g_set, dh, BASE_G(BK_DOWN), m->dx, 0, a->h, &a->h_t, N, T, F, d, mm, NULL));
    progress(m);
    /* SwiGLU's backward makes the amax of dgu, the gate|up products' FP8 operand */
    float *amax = operand_amax(m, 1);
    PROF(m, PROF_SWIGLU, o->swiglu_bwd(dgu, dh, a->gu, N, F, amax));
    PROF(m, PROF_MATMUL_BWD, product_bwd(m, l, 2, p, ap, ag, g_set, m->dln, BASE_G(BK_GATE), dgu, 1, a->ln2, &a->ln2_t, N, T, d,
                  2 * F, mm, amax));
    progress(m);
    PROF(m, PROF_NORM, o->rmsnorm_bwd(m->dx, NORM_G(BK_LN2), m->dln, a->xmid, wptr(m, p, u, BK_LN2),
                   a->rstd2, N, d));
    /* attention: xmid = x + att·Woᵀ */
    void *datt = m->dwide1, *dqkv = m->dwide2;
    PROF(m, PROF_MATMUL_BWD, product_bwd(m, l, 1, p, ap, ag, g_set, datt, BASE_G(BK_O), m->dx, 0, a->att, &no_transpose, N, T,
                  m->att_dim, d, mm, NULL));
    progress(m);
    /* rope: dqkv comes back w.r.t. the pre-RoPE q, k (the inverse rotation of the
     * post-RoPE gradient), fused into the attention backward's epilogues on cuda, so the
     * backward's RoPE time is counted under attention bwd (PROF_ROPE is the forward's) */
    PROF(m, PROF_ATTN_BWD, o->attention_bwd(dqkv, datt, a->qkv, a->att, a->lse, m->doc, B, T, c->n_heads, c->n_kv_heads,
                     c->head_dim, &m->rope));
    progress(m);
    /* the biases sit before RoPE, where dqkv is: their gradient is its column sums */
    if (c->qkv_bias && !lo) PROF(m, PROF_MATMUL_BWD, o->bias_grad(gptr(m, g, u, BK_QB), dqkv, N, m->qkv_dim, g_set));
    PROF(m, PROF_MATMUL_BWD, product_bwd(m, l, 0, p, ap, ag, g_set, m->dln, BASE_G(BK_Q), dqkv, 1, a->ln1, &a->ln1_t, N, T, d,
                  m->qkv_dim, mm, NULL));
    progress(m);
    PROF(m, PROF_NORM, o->rmsnorm_bwd(m->dx, NORM_G(BK_LN1), m->dln, m->x[l], wptr(m, p, u, BK_LN1),
                   a->rstd1, N, d));
#undef BASE_G
#undef NORM_G
}

static void check_shape(const decoder *m, int B, int T) {
    if (B < 1 || T < 1 || B > m->B || T > m->T)
        SHLM_FATAL("batch %dx%d exceeds the model's capacity %dx%d", B, T, m->B, m->T);
}

static int count_valid(const int32_t *targets, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) v += targets[i] >= 0;
    return v;
}

/* Unit u's gathered adapters (LoRA), or NULL. Valid while u is acquired. */
static const void *adapters_of(const decoder *m, int u) {
    return m->lora_on && m->src.adapter ? m->src.adapter(m->src.ctx, u) : NULL;
}

/* Embedding and every block forward; leaves x[L] filled. doc_start (host, or NULL) is
 * uploaded once for the whole pass, forward and backward. */
static void trunk_forward(decoder *m, const int32_t *tokens, const int32_t *doc_start,
                          int B, int T, const uint64_t *row_keys) {
    const shlm_ops *o = m->ops;
    const int N = B * T;
    if (m->lora_on) lora_linear_begin(&m->lora, row_keys, B);
    o->to_device(m->tokens_dev, tokens, (size_t)N * sizeof(int32_t));
    m->doc = NULL;
    if (doc_start) {
        o->to_device(m->doc_dev, doc_start, (size_t)N * sizeof(int32_t));
        m->doc = m->doc_dev;
    }
    const void *p;
    PROF(m, PROF_ENGINE, p = m->src.acquire(m->src.ctx, DECODER_UNIT_EMBED, MODEL_FWD));
    PROF(m, PROF_EMBED, o->embedding_fwd(m->x[0], m->tokens_dev, p, N, m->cfg.dim));
    PROF(m, PROF_ENGINE, m->src.release(m->src.ctx, DECODER_UNIT_EMBED, MODEL_FWD));
    for (int l = 0; l < m->cfg.n_layers; l++) {
        int u = decoder_unit_block(l);
        PROF(m, PROF_ENGINE, p = m->src.acquire(m->src.ctx, u, MODEL_FWD));
        range_unit(m, "fwd", l);
        block_forward(m, l, p, adapters_of(m, u), B, T, 1);
        shlm_range_pop(m->ops);
        PROF(m, PROF_ENGINE, m->src.release(m->src.ctx, u, MODEL_FWD));
    }
}

/* Copies n act-dtype elements from the backend to host fp32. */
static void act_to_host_f32(decoder *m, float *dst, const void *src, size_t n) {
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

static double sum_losses(decoder *m, int N) {
    float *h = malloc((size_t)N * sizeof(float));
    SHLM_CHECK_ALLOC(h);
    m->ops->to_host(h, m->losses, (size_t)N * sizeof(float));
    double s = 0;
    for (int i = 0; i < N; i++) s += h[i];
    free(h);
    return s;
}

double decoder_forward_backward(decoder *m, const model_batch *b, float grad_scale,
                                int *n_valid) {
    const int32_t *tokens = b->tokens, *targets = b->targets, *doc_start = b->doc_start;
    const int B = b->B, T = b->T;
    check_shape(m, B, T);
    const shlm_ops *o = m->ops;
    const decoder_config *c = &m->cfg;
    const int N = B * T, d = c->dim, V = c->vocab_size, L = c->n_layers;
    const int valid = count_valid(targets, N);
    if (n_valid) *n_valid = valid;
    trunk_forward(m, tokens, doc_start, B, T, b->row_keys);
    o->to_device(m->targets_dev, targets, (size_t)N * sizeof(int32_t));
    /* LoRA: the embedding, the norms and the head are frozen (no gradient: the norms' goes
     * to the sink, the products' is not computed); the blocks' adapters train */
    const int lo = m->lora_on;
    if (lo) PROF(m, PROF_COPY, o->zero(m->sink, (size_t)d * sizeof(float)));

    /* head: final norm, then logits, loss and their gradient chunk by chunk, so the
     * (N, V) logits never exist whole; the head's backward runs right here. Tied: the
     * head is unit 0 and this is the first of its two gradient parts */
    const int hu = m->head, kn = m->head_norm, ko = m->head_out;
    const void *p;
    PROF(m, PROF_ENGINE, p = m->src.acquire(m->src.ctx, hu, MODEL_HEAD));
    float *g = NULL;
    int g_set = 0;
    if (!lo) PROF(m, PROF_ENGINE, g = m->src.grad(m->src.ctx, hu, &g_set));
    if (g_set) PROF(m, PROF_COPY, o->zero(gptr(m, g, hu, kn), (size_t)d * sizeof(float)));
    PROF(m, PROF_NORM, o->rmsnorm_fwd(m->lnf, m->rstdf, m->x[L], wptr(m, p, hu, kn), N, d, c->norm_eps, NULL));
    /* each chunk writes its own rows of dln; the first chunk sets a fresh lm_head gradient */
    for (int r0 = 0; r0 < N; r0 += m->chunk_rows) {
        const int mm = SHLM_MM_SET_DINP | (g_set && r0 == 0 ? SHLM_MM_SET_DWEIGHT : 0);
        int rows = N - r0 < m->chunk_rows ? N - r0 : m->chunk_rows;
        const void *lnf_r = (const char *)m->lnf + (size_t)r0 * d * m->esz;
        PROF(m, PROF_MATMUL_FWD, o->matmul_fwd(m->logits, lnf_r, wptr(m, p, hu, ko), rows, d, V, NULL));
        /* the caller's normalisation: each trained target's loss gradient is grad_scale */
        PROF(m, PROF_LOSS, o->xent_fwd_bwd(m->losses + r0, m->logits, m->logits, m->targets_dev + r0, rows, V,
                        grad_scale));
        PROF(m, PROF_MATMUL_BWD, o->matmul_bwd((char *)m->dln + (size_t)r0 * d * m->esz, lo ? NULL : gptr(m, g, hu, ko), m->logits,
                      lnf_r, wptr(m, p, hu, ko), rows, d, V, mm));
    }
    PROF(m, PROF_COPY, o->zero(m->dx, (size_t)N * d * m->esz));
    PROF(m, PROF_NORM, o->rmsnorm_bwd(m->dx, lo ? m->sink : gptr(m, g, hu, kn), m->dln, m->x[L], wptr(m, p, hu, kn),
                   m->rstdf, N, d));
    PROF(m, PROF_ENGINE, m->src.release(m->src.ctx, hu, MODEL_HEAD));
    if (!lo) PROF(m, PROF_ENGINE, m->src.grad_ready(m->src.ctx, hu));

    for (int l = L - 1; l >= 0; l--) {
        int u = decoder_unit_block(l);
        PROF(m, PROF_ENGINE, p = m->src.acquire(m->src.ctx, u, MODEL_BWD));
        PROF(m, PROF_ENGINE, g = m->src.grad(m->src.ctx, u, &g_set));
        range_unit(m, "bwd", l);
        block_backward(m, l, p, adapters_of(m, u), g, g_set, B, T);
        shlm_range_pop(m->ops);
        PROF(m, PROF_ENGINE, m->src.release(m->src.ctx, u, MODEL_BWD));
        PROF(m, PROF_ENGINE, m->src.grad_ready(m->src.ctx, u));
    }
    if (!lo) {
        /* the embedding's backward needs no parameters, only the token ids; tied, it is
         * unit 0's second gradient part (a fresh buffer is zeroed whole, its norm part
         * included) */
        PROF(m, PROF_ENGINE, g = m->src.grad(m->src.ctx, DECODER_UNIT_EMBED, &g_set));
        if (g_set) /* a scatter-add: start a fresh gradient at zero */
            PROF(m, PROF_COPY, o->zero(g, m->lay.units[DECODER_UNIT_EMBED].numel * sizeof(float)));
        PROF(m, PROF_EMBED, o->embedding_bwd(g, m->dx, m->tokens_dev, N, d));
        PROF(m, PROF_ENGINE, m->src.grad_ready(m->src.ctx, DECODER_UNIT_EMBED));
    }
    /* read the losses back only now: a copy to the host mid-pass would stall a GPU */
    return sum_losses(m, N);
}

double decoder_forward(decoder *m, const model_batch *b, int *n_valid, float *logits_out,
                       float *last_logits_out) {
    const int32_t *tokens = b->tokens, *targets = b->targets, *doc_start = b->doc_start;
    const int B = b->B, T = b->T;
    check_shape(m, B, T);
    const shlm_ops *o = m->ops;
    const decoder_config *c = &m->cfg;
    const int N = B * T, d = c->dim, V = c->vocab_size, L = c->n_layers;
    trunk_forward(m, tokens, doc_start, B, T, NULL);
    const int hu = m->head, ko = m->head_out;
    const void *p;
    PROF(m, PROF_ENGINE, p = m->src.acquire(m->src.ctx, hu, MODEL_HEAD));
    PROF(m, PROF_NORM, o->rmsnorm_fwd(m->lnf, m->rstdf, m->x[L], wptr(m, p, hu, m->head_norm), N, d, c->norm_eps, NULL));
    int valid = 0;
    double loss_sum = 0;
    if (targets || logits_out) {
        if (targets) o->to_device(m->targets_dev, targets, (size_t)N * sizeof(int32_t));
        for (int r0 = 0; r0 < N; r0 += m->chunk_rows) {
            int rows = N - r0 < m->chunk_rows ? N - r0 : m->chunk_rows;
            const void *lnf_r = (const char *)m->lnf + (size_t)r0 * d * m->esz;
            PROF(m, PROF_MATMUL_FWD, o->matmul_fwd(m->logits, lnf_r, wptr(m, p, hu, ko), rows, d, V, NULL));
            if (logits_out) act_to_host_f32(m, logits_out + (size_t)r0 * V, m->logits,
                                            (size_t)rows * V);
            if (targets)
                PROF(m, PROF_LOSS, o->xent_fwd_bwd(m->losses + r0, NULL, m->logits, m->targets_dev + r0, rows, V,
                                0.0f));
        }
        if (targets) {
            valid = count_valid(targets, N);
            loss_sum = sum_losses(m, N);
        }
    }
    if (last_logits_out) {
        for (int b = 0; b < B; b++) {
            const void *row = (const char *)m->lnf + ((size_t)b * T + T - 1) * d * m->esz;
            PROF(m, PROF_MATMUL_FWD, o->matmul_fwd(m->logits, row, wptr(m, p, hu, ko), 1, d, V, NULL));
            act_to_host_f32(m, last_logits_out + (size_t)b * V, m->logits, (size_t)V);
        }
    }
    PROF(m, PROF_ENGINE, m->src.release(m->src.ctx, hu, MODEL_HEAD));
    if (n_valid) *n_valid = valid;
    return loss_sum;
}

/* ---- what the KV-cache decode shares (decoder.h) ---- */

decoder_parts decoder_parts_of(const decoder *m) {
    return (decoder_parts){&m->cfg, m->ops, m->src, &m->rope, m->head, m->eager_decode};
}

const void *decoder_part_ptr(const decoder *m, const void *p, int l, decoder_part part) {
    static const int block[] = {[DECODER_LN1] = BK_LN1, [DECODER_QKV] = BK_Q,
                                [DECODER_QKV_BIAS] = BK_QB, [DECODER_O] = BK_O,
                                [DECODER_LN2] = BK_LN2, [DECODER_GATE_UP] = BK_GATE,
                                [DECODER_DOWN] = BK_DOWN};
    if (part == DECODER_NORM) return wptr(m, p, m->head, m->head_norm);
    if (part == DECODER_OUT) return wptr(m, p, m->head, m->head_out);
    return wptr(m, p, decoder_unit_block(l), block[part]);
}

void decoder_linear(decoder *m, const void *p, int l, decoder_part part, void *out,
                    const void *inp, int N, const void *residual) {
    const decoder_config *c = &m->cfg;
    const int d = c->dim, F = c->ffn_dim;
    int k, C, OC; /* k: the product in fp8_first's order, as product_fwd takes it */
    switch (part) {
    case DECODER_QKV: k = 0, C = d, OC = m->qkv_dim; break;
    case DECODER_O: k = 1, C = m->att_dim, OC = d; break;
    case DECODER_GATE_UP: k = 2, C = d, OC = 2 * F; break;
    case DECODER_DOWN: k = 3, C = F, OC = d; break;
    default: SHLM_FATAL("decoder_linear: part %d is not a product", (int)part);
    }
    /* LoRA's adapters apply as in the forward, without dropout (an evaluation) */
    const int lo = m->lora_on && lora_linear_on(&m->lora, l, k);
    const void *ap = lo ? adapters_of(m, decoder_unit_block(l)) : NULL;
    if (lo) lora_linear_begin(&m->lora, NULL, 0);
    /* FP8's operand buffers and LoRA's hold the model's B·T rows */
    const int most = m->matmul == MODEL_MATMUL_BF16 && !lo ? N : m->B * m->T;
    for (int r0 = 0; r0 < N; r0 += most) {
        const int rows = N - r0 < most ? N - r0 : most;
        const size_t at = (size_t)r0 * m->esz;
        product_fwd(m, l, k, p, ap, (char *)out + at * OC, (const char *)inp + at * C, rows, rows,
                    C, OC, residual ? (const char *)residual + at * OC : NULL, &no_transpose, NULL);
        progress(m);
    }
}
