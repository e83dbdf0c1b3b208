/* The decoder-only transformer that the families share: a token embedding; L blocks of
 * RMSNorm, grouped-query attention with RoPE, a residual, RMSNorm, a SwiGLU MLP, a
 * residual; a final RMSNorm and the output projection (its own lm_head, or the embedding:
 * tied). Hugging Face's LlamaForCausalLM arithmetic. Its parameter layout (one flat buffer
 * per FSDP unit, tensors under Hugging Face names), initial values, forward and backward
 * over the ops table, one unit at a time through a model_param_source; the [model] keys of
 * its shape and their rules, config.json's common members, parameter and FLOP counts. A
 * family (src/model/NAME/) is this shape with its own presets, defaults and config.json
 * rules. */
#ifndef SHLM_DECODER_H
#define SHLM_DECODER_H

#include <cjson/cJSON.h>
#include <float.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "src/base/keys.h"
#include "src/engine/model.h"
#include "src/model/family.h"

typedef struct decoder_config {
    int dim;          /* d: model width */
    int n_layers;     /* L */
    int n_heads;      /* query heads */
    int n_kv_heads;   /* key/value heads (GQA); divides n_heads */
    int head_dim;     /* dim / n_heads */
    int ffn_dim;      /* F: SwiGLU hidden width */
    int vocab_size;   /* V */
    int max_seq_len;  /* longest sequence the job may use */
    float norm_eps;   /* RMSNorm epsilon */
    float rope_theta; /* RoPE base */
    float init_std;   /* std of the normal init of every matrix */
    int tie_word_embeddings; /* 1: the output projection is model.embed_tokens.weight itself
                              * (one tensor, trained by both uses), as Hugging Face's
                              * tie_word_embeddings; 0: a separate lm_head.weight */
    int qkv_bias;     /* 1: the q, k and v projections have biases (Qwen2's
                       * self_attn.{q,k,v}_proj.bias), added after the product, before RoPE */
    /* RoPE's frequency rule and its parameters (kernels/rope_freq.h, with rope_theta);
     * the parameters a type does not use are 0 */
    shlm_rope_type rope_type;
    float rope_factor;              /* linear, llama3 */
    float rope_low_freq_factor;     /* llama3 */
    float rope_high_freq_factor;    /* llama3 */
    int rope_original_max_pos;      /* llama3: original_max_position_embeddings */
} decoder_config;

/* ---- the [model] keys of a decoder shape, in this order (checkpoints store them so) ---- */
enum decoder_key {
    DK_DIM, DK_N_LAYERS, DK_N_HEADS, DK_N_KV_HEADS, DK_HEAD_DIM, DK_FFN_DIM, DK_VOCAB_SIZE,
    DK_MAX_SEQ_LEN, DK_NORM_EPS, DK_ROPE_THETA, DK_INIT_STD, DK_TIE_WORD_EMBEDDINGS,
    DK_QKV_BIAS, DK_ROPE_TYPE, DK_ROPE_FACTOR, DK_ROPE_LOW_FREQ_FACTOR, DK_ROPE_HIGH_FREQ_FACTOR,
    DK_ROPE_ORIGINAL_MAX_POS, DK_N
};
#define DECODER_F(field) offsetof(decoder_config, field), sizeof(((decoder_config *)0)->field)
/* The rows of a family's key table; a family gives its own defaults of the RoPE base and
 * of qkv_bias as text. */
#define DECODER_KEY_ROWS(ROPE_THETA_DEFAULT, QKV_BIAS_DEFAULT)                                  \
    {"model", "dim", KT_INT, DECODER_F(dim), NULL, 1, 1 << 20, NULL, KF_MODEL | KF_SHAPE | KF_LAYOUT,       \
     "model width d"},                                                                          \
    {"model", "n_layers", KT_INT, DECODER_F(n_layers), NULL, 1, 1 << 16, NULL,                  \
     KF_MODEL | KF_SHAPE | KF_LAYOUT, "transformer blocks L"},                                              \
    {"model", "n_heads", KT_INT, DECODER_F(n_heads), NULL, 1, 1 << 16, NULL,                    \
     KF_MODEL | KF_SHAPE | KF_LAYOUT, "query heads"},                                                       \
    {"model", "n_kv_heads", KT_INT, DECODER_F(n_kv_heads), NULL, 1, 1 << 16, NULL,              \
     KF_MODEL | KF_LAYOUT,                                                                       \
     "key/value heads (grouped-query attention), dividing n_heads; without a preset: n_heads"}, \
    {"model", "head_dim", KT_INT, DECODER_F(head_dim), NULL, 1, 1 << 20, NULL,                  \
     KF_MODEL | KF_DERIVED | KF_LAYOUT, "width of one head: dim / n_heads"},                                \
    {"model", "ffn_dim", KT_INT, DECODER_F(ffn_dim), NULL, 1, 1 << 24, NULL,                    \
     KF_MODEL | KF_SHAPE | KF_LAYOUT, "SwiGLU hidden width"},                                               \
    {"model", "vocab_size", KT_INT, DECODER_F(vocab_size), NULL, 2, 1 << 30, NULL,              \
     KF_MODEL | KF_SHAPE | KF_LAYOUT, "vocabulary V: rows of the embedding (and of lm_head)"},              \
    {"model", "max_seq_len", KT_INT, DECODER_F(max_seq_len), NULL, 1, 1 << 24, NULL,            \
     KF_MODEL | KF_DERIVED,                                                                     \
     "the longest sequence the model takes; without a preset: train.seq_len"},                  \
    {"model", "norm_eps", KT_FLOAT, DECODER_F(norm_eps), "1e-5", 0, 1, NULL,                    \
     KF_MODEL | KF_MIN_OPEN, "RMSNorm epsilon"},                                                \
    {"model", "rope_theta", KT_FLOAT, DECODER_F(rope_theta), ROPE_THETA_DEFAULT, 0, 1e12, NULL, \
     KF_MODEL | KF_MIN_OPEN, "RoPE base"},                                                      \
    {"model", "init_std", KT_FLOAT, DECODER_F(init_std), "0.02", 0, 10, NULL,                   \
     KF_MODEL | KF_MIN_OPEN,                                                                    \
     "standard deviation of the normal initialisation of every matrix"},                        \
    {"model", "tie_word_embeddings", KT_BOOL, DECODER_F(tie_word_embeddings), "false", 0, 0,    \
     NULL, KF_MODEL | KF_LAYOUT,                                                                \
     "the output projection is the embedding (one tensor, as Hugging Face's "                   \
     "tie_word_embeddings)"},                                                                   \
    {"model", "qkv_bias", KT_BOOL, DECODER_F(qkv_bias), QKV_BIAS_DEFAULT, 0, 0, NULL,           \
     KF_MODEL | KF_LAYOUT,                                                                      \
     "the q, k and v projections have biases (added after the product, before RoPE; no "       \
     "weight decay)"},                                                                          \
    {"model", "rope_type", KT_ENUM, DECODER_F(rope_type), "default", 0, 0,                      \
     "default|linear|llama3", KF_MODEL,                                                         \
     "RoPE's frequencies: default (rope_theta alone), linear (divided by rope_factor), llama3 " \
     "(Llama-3.1's bands: the rope_* keys below)"},                                             \
    {"model", "rope_factor", KT_FLOAT, DECODER_F(rope_factor), "0", 0, 1e6, NULL, KF_MODEL,     \
     "rope_type linear and llama3: how much longer the context is than the one trained "        \
     "(config.json's factor); 0 with default"},                                                 \
    {"model", "rope_low_freq_factor", KT_FLOAT, DECODER_F(rope_low_freq_factor), "0", 0, 1e6,   \
     NULL, KF_MODEL,                                                                            \
     "rope_type llama3: wavelengths past original_max_position_embeddings / this are divided "  \
     "by rope_factor; 0 otherwise"},                                                            \
    {"model", "rope_high_freq_factor", KT_FLOAT, DECODER_F(rope_high_freq_factor), "0", 0, 1e6, \
     NULL, KF_MODEL,                                                                            \
     "rope_type llama3: wavelengths under original_max_position_embeddings / this are kept "    \
     "(between the two: interpolated); 0 otherwise"},                                           \
    {"model", "rope_original_max_position_embeddings", KT_INT,                                  \
     DECODER_F(rope_original_max_pos), "0", 0, 1 << 24, NULL, KF_MODEL,                         \
     "rope_type llama3: the context the model was first trained with; 0 otherwise"}
/* config.json's names of the keys above (NULL: not there) */
extern const char *const decoder_hf_names[DK_N];

/* RoPE's type and parameters of a shape, as kernels/rope_freq.h takes them. */
shlm_rope_params decoder_rope_params(const decoder_config *c);

/* The derived fields: head_dim = dim / n_heads; without set[DK_N_KV_HEADS], n_kv_heads =
 * n_heads. */
void decoder_derive(decoder_config *c, const unsigned char *set);
/* family.h's validate for a decoder shape (blame indices are enum decoder_key's). */
int decoder_validate(const decoder_config *c, char *err, size_t errlen, int blame[2]);
/* config.json's LlamaConfig members every decoder family reads alike (hidden_size, ...,
 * tie_word_embeddings, hidden_act silu) and RoPE's in either form: rope_theta and
 * rope_scaling (null, or {rope_type (or type), factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings}) at the top, as the Hub's files have them, or
 * transformers 5's rope_parameters {rope_type, rope_theta, ...}; a rope type other than
 * default, linear and llama3 is refused naming it. A family checks its own members
 * (biases, sliding windows) itself. init_std keeps c's value. */
int decoder_hf_read(const cJSON *j, const char *path, decoder_config *c, char *err,
                    size_t errlen);
/* The members decoder_hf_read reads, written into j: RoPE's in the form j has (inside
 * rope_parameters when j holds that object, else rope_theta and rope_scaling at the top,
 * null for default; a rope_scaling object's "type" member kept under that name). */
void decoder_hf_write(const decoder_config *c, cJSON *j);
/* family.h's hf_unused: lm_head.weight of a tied model, a layer's
 * self_attn.rotary_emb.inv_freq (recomputed from the RoPE settings). */
const char *decoder_hf_unused(const void *shape, const char *tensor);
/* Total parameter count (embedding, blocks with their q/k/v biases, final norm, output
 * projection unless tied). */
int64_t decoder_param_count(const decoder_config *c);
/* 6 per parameter and 12·L·d·T for attention's scores (PaLM's count), per token. */
double decoder_flops_per_token(const decoder_config *c, int T);

/* ---- parameter layout (src/engine/model.h) ----
 * Units: 0 = embedding; 1..L = transformer block l-1; L+1 = final norm + lm_head.
 * Tied embeddings (tie_word_embeddings) have L+1 units: unit 0 holds the embedding, which
 * is also the output projection, and the final norm (embed_tokens | norm), so the head is
 * unit 0 again; no lm_head.weight exists. The head's backward and the embedding's each hand
 * unit 0's gradient back once per micro-batch (grad_writes = 2).
 * Inside a block the tensors sit in this order, so that q,k,v form one fused
 * (nh+2·nkv)·hd × d matrix and gate,up one 2F × d matrix:
 *   input_layernorm (d) | q_proj | k_proj | v_proj | o_proj |
 *   post_attention_layernorm (d) | gate_proj | up_proj | down_proj
 * and with qkv_bias, after them, the biases as one (nh+2·nkv)·hd vector:
 *   | q_proj.bias | k_proj.bias | v_proj.bias
 * (last, so a shape without them lays out as before). Biases start at 0 and, like the
 * norm weights, are not decayed (PyTorch and Hugging Face recipes leave 1-D parameters
 * out of weight decay).                                                     */
void decoder_layout(const decoder_config *c, model_layout *lay);
/* Unit index of transformer block l, of the embedding, of the head. */
static inline int decoder_unit_block(int l) { return 1 + l; }
enum { DECODER_UNIT_EMBED = 0 };
static inline int decoder_unit_head(const decoder_config *c) {
    return c->tie_word_embeddings ? DECODER_UNIT_EMBED : c->n_layers + 1;
}
/* The engine's side of a decoder (its functions take a const decoder_config *): initial
 * values are a pure function of (seed, unit, element), matrices ~ N(0, init_std²), norm
 * weights 1, so every world size starts from the same model. */
extern const model_spec decoder_spec;
/* Elements decoder_spec.init_slice has written in this process. */
uint64_t decoder_init_count(void);

/* ---- the model (family.h's compute side over a decoder_config) ---- */
typedef struct decoder decoder;
/* Activation checkpointing (model.h): SELECTIVE keeps the block input and the matmul
 * outputs (qkv, the residual after attention, gate|up) and recomputes the norms,
 * attention and SwiGLU; FULL keeps only the block input and recomputes the whole block.
 * An FP8 recipe runs the blocks' linear layers through src/model/fp8_linear.h. */
decoder *decoder_create(const decoder_config *c, const shlm_ops *ops, int B, int T,
                        const model_opts *o, model_param_source src);
void decoder_destroy(decoder *m);
/* family.h's forward_backward and forward */
double decoder_forward_backward(decoder *m, const model_batch *b, float grad_scale,
                                int *n_valid);
double decoder_forward(decoder *m, const model_batch *b, int *n_valid, float *logits_out,
                       float *last_logits_out);
size_t decoder_activation_bytes(const decoder *m);
const model_layout *decoder_get_layout(const decoder *m);

/* ---- what the KV-cache decode (decoder_decode.c) shares with the forward ---- */
/* The parts of a block or of the head a decode reads from an acquired unit. */
typedef enum decoder_part {
    DECODER_LN1,      /* input_layernorm.weight (d) */
    DECODER_QKV,      /* q|k|v_proj.weight, the fused product ((nh+2·nkv)·hd x d) */
    DECODER_QKV_BIAS, /* q|k|v_proj.bias (qkv_bias) */
    DECODER_O,        /* o_proj.weight */
    DECODER_LN2,      /* post_attention_layernorm.weight */
    DECODER_GATE_UP,  /* gate|up_proj.weight, the fused product (2F x d) */
    DECODER_DOWN,     /* down_proj.weight */
    DECODER_NORM,     /* the head's model.norm.weight */
    DECODER_OUT       /* the head's output projection (lm_head, or the tied embedding) */
} decoder_part;
/* What a model computes with. */
typedef struct decoder_parts {
    const decoder_config *cfg;
    const shlm_ops *ops;
    model_param_source src;
    const shlm_rope *rope;  /* RoPE's frequencies, as the forward rotates */
    int head;               /* the head's unit */
    int eager_decode;       /* model_opts.eager_decode */
} decoder_parts;
decoder_parts decoder_parts_of(const decoder *m);
/* Part `part` of the acquired unit p (act dtype): of block l's unit, or of the head's
 * (DECODER_NORM, DECODER_OUT; l ignored). */
const void *decoder_part_ptr(const decoder *m, const void *p, int l, decoder_part part);
/* out(N, OC) = inp(N, C) · Wᵀ (+ residual: NULL, or as matmul_fwd's) for block l's
 * product `part` (DECODER_QKV, _O, _GATE_UP, _DOWN) of the acquired unit p, in the
 * model's matmul recipe exactly as its forward runs it, with the product's LoRA adapters
 * where it has them (no dropout); any N (an FP8 recipe or LoRA takes the rows in slices of
 * the model's B·T). */
void decoder_linear(decoder *m, const void *p, int l, decoder_part part, void *out,
                    const void *inp, int N, const void *residual);

/* ---- the KV-cache generator (family.h's decode side; decoder_decode.c) ---- */
typedef struct decoder_gen decoder_gen;
/* Rows of up to cap tokens over model m (m outlives it). A call feeds at most
 * rows·min(cap, DECODER_GEN_CHUNK) tokens through the model at once: a prefill of many
 * rows goes DECODER_GEN_CHUNK tokens a row at a time, the keys and values of each part
 * appended before the next attends to them. */
enum { DECODER_GEN_CHUNK = 64 };
decoder_gen *decoder_gen_create(decoder *m, int rows, int cap);
void decoder_gen_destroy(decoder_gen *g);
void decoder_gen_prefill(decoder_gen *g, int n, const int *rows,
                         const int32_t *const *prompts, const int *lens, float *logits);
void decoder_gen_decode(decoder_gen *g, int n, const int *rows, const int32_t *tokens,
                        float *logits);
size_t decoder_gen_bytes(const decoder_gen *g);
/* model_spec.generator_bytes of a decoder shape */
size_t decoder_generator_bytes(const void *cfg, shlm_dtype act, int rows, int cap,
                               size_t align);

/* ---- profile mode: each op timed between two synchronisations ---- */
enum {
    PROF_MATMUL_FWD, PROF_MATMUL_BWD, PROF_ATTN_FWD, PROF_ATTN_BWD, PROF_NORM, PROF_ROPE,
    PROF_SWIGLU, PROF_COPY, PROF_LOSS, PROF_EMBED, PROF_ENGINE, DECODER_PROF_N
};
extern const char *const decoder_prof_names[DECODER_PROF_N];
void decoder_set_profile(decoder *m, int on);
void decoder_take_profile(decoder *m, double *seconds);

/* The compute and engine members of a model_family for a decoder family (designated
 * initialisers inside the family's table). */
#define DECODER_FAMILY_MEMBERS                                                       \
    .spec = &decoder_spec, .create = decoder_family_create,                          \
    .destroy = decoder_family_destroy, .forward_backward = decoder_family_fwd_bwd,    \
    .forward = decoder_family_forward, .activation_bytes = decoder_family_act_bytes,  \
    .n_prof = DECODER_PROF_N, .prof_names = decoder_prof_names,                      \
    .set_profile = decoder_family_set_profile, .take_profile = decoder_family_take_profile, \
    .init_count = decoder_init_count, .param_count = decoder_family_param_count,      \
    .flops_per_token = decoder_family_flops, .vocab_size = decoder_family_vocab_size, \
    .max_seq_len = decoder_family_max_seq_len,                                       \
    .set_max_seq_len = decoder_family_set_max_seq_len, .hf_unused = decoder_hf_unused, \
    .gen_create = decoder_family_gen_create, .gen_destroy = decoder_family_gen_destroy, \
    .gen_prefill = decoder_family_gen_prefill, .gen_decode = decoder_family_gen_decode, \
    .gen_bytes = decoder_family_gen_bytes
void *decoder_family_create(const void *shape, const shlm_ops *ops, int B, int T,
                            const model_opts *o, model_param_source src);
void decoder_family_destroy(void *impl);
double decoder_family_fwd_bwd(void *impl, const model_batch *b, float grad_scale, int *n_valid);
double decoder_family_forward(void *impl, const model_batch *b, int *n_valid, float *logits_out,
                              float *last_logits_out);
size_t decoder_family_act_bytes(const void *impl);
void decoder_family_set_profile(void *impl, int on);
void decoder_family_take_profile(void *impl, double *seconds);
int64_t decoder_family_param_count(const void *shape);
double decoder_family_flops(const void *shape, int T);
int decoder_family_vocab_size(const void *shape);
int decoder_family_max_seq_len(const void *shape);
void decoder_family_set_max_seq_len(void *shape, int T);
void *decoder_family_gen_create(void *impl, int rows, int cap);
void decoder_family_gen_destroy(void *gen);
void decoder_family_gen_prefill(void *gen, int n, const int *rows,
                                const int32_t *const *prompts, const int *lens, float *logits);
void decoder_family_gen_decode(void *gen, int n, const int *rows, const int32_t *tokens,
                               float *logits);
size_t decoder_family_gen_bytes(const void *gen);

#endif
