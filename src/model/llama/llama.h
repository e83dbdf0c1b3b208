/* The Llama-2 model: shape presets, the parameter layout (one flat buffer per FSDP
 * unit, tensors under Hugging Face names), forward and backward over the ops table. */
#ifndef SHLM_LLAMA_H
#define SHLM_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "src/engine/model.h"

typedef struct llama_config {
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
} llama_config;

/* Fills *cfg from a preset name; returns 0, or -1 if the name is unknown. */
int llama_preset(const char *name, llama_config *cfg);
/* Space-separated list of preset names, for messages. */
const char *llama_preset_names(void);
/* Checks the shape; on failure writes a message into err and returns -1. */
int llama_config_validate(const llama_config *cfg, char *err, size_t errlen);
/* Total parameter count (embedding, blocks, final norm, output projection unless tied). */
int64_t llama_param_count(const llama_config *cfg);

/* ---- parameter layout (model.h's, under the family's names) ----
 * Units: 0 = embedding; 1..L = transformer block l-1; L+1 = final norm + lm_head.
 * Tied embeddings (tie_word_embeddings) have L+1 units: unit 0 holds the embedding, which
 * is also the output projection, and the final norm (embed_tokens | norm), so the head is
 * unit 0 again; no lm_head.weight exists. The head's backward and the embedding's each hand
 * unit 0's gradient back once per micro-batch (grad_writes = 2).
 * Inside a block the tensors sit in this order, so that q,k,v form one fused
 * (nh+2·nkv)·hd × d matrix and gate,up one 2F × d matrix:
 *   input_layernorm (d) | q_proj | k_proj | v_proj | o_proj |
 *   post_attention_layernorm (d) | gate_proj | up_proj | down_proj            */
typedef model_tensor llama_tensor;
typedef model_unit llama_unit;
typedef model_layout llama_layout;

/* The Llama family of model.h (its functions take a const llama_config *). */
extern const model_spec llama_family;

void llama_layout_init(llama_layout *lay, const llama_config *cfg);
static inline void llama_layout_free(llama_layout *lay) { model_layout_free(lay); }
/* Unit index of transformer block l, of the embedding, of the head. */
static inline int llama_unit_block(int l) { return 1 + l; }
enum { LLAMA_UNIT_EMBED = 0 };
static inline int llama_unit_head(const llama_config *c) {
    return c->tie_word_embeddings ? LLAMA_UNIT_EMBED : c->n_layers + 1;
}

/* Writes the initial values of elements [begin, end) of unit u's flat buffer into
 * out (host fp32, end-begin elements). A pure function of (seed, unit, element): any
 * rank can initialise exactly the slice it owns, and every world size gets the same
 * model. Matrices ~ N(0, init_std²), norm weights = 1. */
void llama_init_slice(const llama_layout *lay, const llama_config *cfg, uint64_t seed, int u,
                      size_t begin, size_t end, float *out);
/* Elements llama_init_slice has written in this process (the start-up line reports it:
 * none when weights were imported or resumed). */
uint64_t llama_init_count(void);

/* The phases and the parameter source are model.h's (the engine's side of the model). */
typedef model_phase llama_phase;
#define LLAMA_FWD MODEL_FWD
#define LLAMA_BWD MODEL_BWD
#define LLAMA_HEAD MODEL_HEAD
typedef model_param_source llama_param_source;

/* ---- the model ---- */
typedef struct llama_model llama_model;

/* Activation checkpointing (model.h): SELECTIVE keeps the block input and the matmul
 * outputs (qkv, the residual after attention, gate|up) and recomputes the norms,
 * attention and SwiGLU; FULL keeps only the block input and recomputes the whole block. */
typedef model_ac llama_ac;
#define LLAMA_AC_NONE MODEL_AC_NONE
#define LLAMA_AC_FULL MODEL_AC_FULL
#define LLAMA_AC_SELECTIVE MODEL_AC_SELECTIVE

/* Creates a model for batches of at most B sequences of at most T tokens on the
 * given backend; allocates activations only (parameters come from the source). */
llama_model *llama_create(const llama_config *cfg, const shlm_ops *ops, int B, int T,
                          llama_param_source src);
/* The same with an activation-checkpointing mode. */
llama_model *llama_create_ac(const llama_config *cfg, const shlm_ops *ops, int B, int T,
                             llama_ac ac, llama_param_source src);
/* The same with the blocks' matmul recipe (model.h): an FP8 recipe runs their linear layers
 * through src/model/fp8_linear.h and needs ops' FP8 members (aborts without them: train checks
 * ops->fp8_check first). */
llama_model *llama_create_recipe(const llama_config *cfg, const shlm_ops *ops, int B, int T,
                                 llama_ac ac, model_matmul matmul, llama_param_source src);
/* Bytes of activation memory a model of this shape allocates (what llama_create
 * would), without allocating it: for `shardlm plan`. */
size_t llama_activation_bytes_for(const llama_config *cfg, shlm_dtype act, int B, int T,
                                  llama_ac ac);
void llama_destroy(llama_model *m);
const llama_layout *llama_get_layout(const llama_model *m);
/* Bytes of activation memory this model allocated. */
size_t llama_activation_bytes(const llama_model *m);

/* Training pass over one micro-batch: forward, loss, and backward, with gradients
 * accumulated (+=) into the source's grad buffers. The loss gradient of every non-ignored
 * target is grad_scale: the caller normalises (train.c: ranks / trained targets of the
 * whole optimizer step, so the step's gradient is that of the token-weighted mean loss).
 * tokens and targets are host arrays of B·T ids (B ≤ the created B, T ≤ the created T;
 * a target < 0 is ignored); doc_start is NULL (causal attention) or host B·T positions
 * as kernels/ops.h's attention takes them (each token attends to its own document only),
 * uploaded once per call. Returns the SUM of the non-ignored targets' losses, and their
 * count in *n_valid (may be NULL); no target at all gives 0 and a zero gradient. */
double llama_forward_backward(llama_model *m, const int32_t *tokens, const int32_t *targets,
                              const int32_t *doc_start, int B, int T, float grad_scale,
                              int *n_valid);

/* Forward only, causal attention. With targets: returns the mean loss over non-ignored
 * targets (count in *n_valid). With logits_out (host, B·T·V fp32): writes every position's
 * logits. With last_logits_out (host, B·V fp32): writes position T-1's logits of each row. */
float llama_forward(llama_model *m, const int32_t *tokens, const int32_t *targets, int B,
                    int T, int *n_valid, float *logits_out, float *last_logits_out);
/* The same with doc_start (as llama_forward_backward), returning the loss SUM over the
 * non-ignored targets (validation adds these up over ranks and divides once). */
double llama_forward_docs(llama_model *m, const int32_t *tokens, const int32_t *targets,
                          const int32_t *doc_start, int B, int T, int *n_valid,
                          float *logits_out, float *last_logits_out);

/* ---- profile mode: each op timed between two synchronisations ---- */
enum {
    PROF_MATMUL_FWD, PROF_MATMUL_BWD, PROF_ATTN_FWD, PROF_ATTN_BWD, PROF_NORM, PROF_ROPE,
    PROF_SWIGLU, PROF_COPY, PROF_LOSS, PROF_EMBED, PROF_ENGINE, LLAMA_PROF_N
};
extern const char *const llama_prof_names[LLAMA_PROF_N];
void llama_set_profile(llama_model *m, int on);
/* on 1: an FP8 recipe's forward products may use fast accumulation (matmul_fp8's
 * SHLM_FP8_FAST_ACCUM); 0, the default: fp32 sums */
void llama_set_fp8_fast_accum(llama_model *m, int on);
/* Seconds spent per category since the last call (then zeroed). */
void llama_take_profile(llama_model *m, double *seconds);

#endif
