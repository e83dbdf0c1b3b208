/* A model family: everything the job, the run, checkpoints, generation and `plan` know
 * of an architecture, behind one table (torchtitan's TrainSpec is the pattern). A family
 * lives in one folder, src/model/NAME/, which fills one model_family; src/families/
 * lists them. Nothing outside the folder includes the family's header but that registry:
 * the rest of the program sees a shape (model_shape: the family and its own struct,
 * opaque) and a compute object (model).
 *
 * Shape side: the family's [model] keys (fields of its shape struct, key_def's), its
 * presets, config.json in and out, derived fields and validation, parameter count and
 * training FLOPs per token, the default chat template. Engine side: model_spec (units,
 * passes, initial values, activation and generator bytes: src/engine/model.h). Compute
 * side: create a model for micro-batches of B x T with its options, a training pass, a
 * forward pass, destroy. Decode side: a KV-cache generator over a model (its ops, parameter
 * source and matmul recipe) for rows of sequences: prefill prompts of any lengths, one
 * token per row per step, the next-token logits of each. */
#ifndef SHLM_FAMILY_H
#define SHLM_FAMILY_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "src/base/keys.h"
#include "src/engine/model.h"

struct model_family;

/* Bytes a family's shape struct may take (checked by a _Static_assert in each family). */
enum { MODEL_SHAPE_BYTES = 256 };

/* A model's shape: its family and the family's struct. Plain data (copied by assignment;
 * the family pointer is a registry entry, never freed). A zeroed shape has no family. */
typedef struct model_shape {
    const struct model_family *family;
    union {
        unsigned char bytes[MODEL_SHAPE_BYTES];
        long double align_; /* the struct inside is aligned for any field */
    } u;
} model_shape;

/* The shape struct inside (the family's; only the family reads its fields). */
static inline void *model_shape_data(model_shape *s) { return s->u.bytes; }
static inline const void *model_shape_cdata(const model_shape *s) { return s->u.bytes; }

/* A named shape of a family (`model.preset`). */
typedef struct model_preset {
    const char *name;
    const void *shape; /* the family's struct, complete (derived fields filled) */
} model_preset;

/* How a model computes, from the job (train.matmul, fsdp.activation_checkpointing,
 * train.fp8_fast_accum, [lora]). */
typedef struct model_opts {
    model_ac ac;
    model_matmul matmul;
    int fp8_fast_accum; /* FP8 forward products may use fast accumulation */
    lora_config lora;   /* rank 0: none; else the parameters are frozen and the adapters
                         * (src/engine/model.h "LoRA") train: the parameter source's grad()
                         * is the adapters' */
    int eager_decode;   /* a generator launches every op of a decode step itself (else it
                         * records the step once where the backend can: ops.h graph_begin) */
} model_opts;

/* One micro-batch as a model takes it: host arrays of B·T. targets: < 0 is ignored; NULL
 * in a forward pass that computes no loss. doc_start: NULL (causal attention) or each
 * token's document start, as kernels/ops.h's attention takes it. row_keys: NULL, or B keys
 * the LoRA adapters' dropout masks are drawn from (one per sequence, a function of the
 * training sample it is: the same masks at every world size). */
typedef struct model_batch {
    const int32_t *tokens, *targets, *doc_start;
    int B, T;
    const uint64_t *row_keys;
} model_batch;

typedef struct model_family {
    const char *name;       /* model.family, and the checkpoint's model.family */
    const char *title;      /* one line for messages and `shardlm keys` ("Llama (LlamaForCausalLM)") */

    /* ---- shape side ---- */
    size_t shape_size;      /* of the family's struct, <= MODEL_SHAPE_BYTES */
    /* The [model] keys (section "model"; offsets into the shape struct), in the order the
     * resolved configuration prints them and checkpoints store them. */
    const key_def *keys;
    int n_keys;
    /* keys[i]'s name in a Hugging Face config.json (NULL: config.json does not hold it, and
     * a job may set it beside model.init_from) */
    const char *const *hf_names;
    const model_preset *presets;
    int n_presets;
    /* config.json's architectures[0] values and model_type values this family reads
     * (NULL-terminated); it writes the first of each */
    const char *const *hf_architectures;
    const char *const *hf_model_types;
    /* Fills the derived fields from the others. set[i] != 0: keys[i] was given (by the job,
     * a preset or config.json), so a default that follows another key (n_kv_heads =
     * n_heads) applies only where it was not. */
    void (*derive)(void *shape, const unsigned char *set);
    /* Every rule of a shape, in one place. 0, or -1 with one message in err naming the keys
     * ("[model] dim = 130 is not divisible by n_heads = 4") and, in blame[0..1], the indices
     * of the keys it is about (-1: none), for the caller to say where they were set. */
    int (*validate)(const void *shape, char *err, size_t errlen, int blame[2]);
    /* Reads config.json (the object j, read from path) into the shape (keys without an
     * hf_name keep their defaults); anything that would change the arithmetic and that the
     * family does not implement is refused naming the member. Derived fields filled. */
    int (*hf_read)(const cJSON *j, const char *path, void *shape, char *err, size_t errlen);
    /* Writes the shape into config.json's object j (which may hold a source's members:
     * kept unless the family owns them), architectures and model_type included. */
    int (*hf_write)(const void *shape, cJSON *j, char *err, size_t errlen);
    /* Why a tensor of a Hugging Face checkpoint that is no parameter of this shape is
     * harmless to skip (a tied model's lm_head.weight), or NULL: it means another model. */
    const char *(*hf_unused)(const void *shape, const char *tensor);
    int64_t (*param_count)(const void *shape);
    /* Training FLOPs per token at sequence length T (forward and backward: 6 per parameter
     * and attention's scores), the MFU numerator. */
    double (*flops_per_token)(const void *shape, int T);
    int (*vocab_size)(const void *shape);
    int (*max_seq_len)(const void *shape);
    void (*set_max_seq_len)(void *shape, int T);
    /* The chat template (src/data/chat_template.h's name) of a model whose tokenizer has
     * none, or NULL: the user names one. */
    const char *chat_template;

    /* ---- engine side (src/engine/model.h) ---- */
    const model_spec *spec;

    /* ---- compute side: a model over a parameter source ---- */
    /* Allocates the activations for micro-batches of at most B x T (parameters come from
     * src). An FP8 matmul in o needs ops that run it (model_check_opts first). */
    void *(*create)(const void *shape, const shlm_ops *ops, int B, int T, const model_opts *o,
                    model_param_source src);
    void (*destroy)(void *impl);
    /* Forward, loss and backward of one micro-batch; every trained target's loss gradient
     * is grad_scale. Returns the loss SUM over the trained targets, their count in
     * *n_valid. */
    double (*forward_backward)(void *impl, const model_batch *b, float grad_scale, int *n_valid);
    /* Forward only: the loss SUM over b->targets' trained ones (when given) and their count;
     * logits_out (host B·T·V fp32) every position's logits; last_logits_out (host B·V) the
     * last position's of each row. */
    double (*forward)(void *impl, const model_batch *b, int *n_valid, float *logits_out,
                      float *last_logits_out);
    /* Bytes of activations it allocated (what spec->activation_bytes counts). */
    size_t (*activation_bytes)(const void *impl);
    /* Profile mode (runtime.profile): each op timed between synchronisations, in n_prof
     * categories named prof_names. */
    int n_prof;
    const char *const *prof_names;
    void (*set_profile)(void *impl, int on);
    void (*take_profile)(void *impl, double *seconds); /* since the last call, then zeroed */
    /* Elements spec->init_slice has written in this process (the start-up line: none when
     * weights were imported or resumed). */
    uint64_t (*init_count)(void);

    /* ---- decode side: generation with a KV cache (optional: NULL gen_create, and
     * generation recomputes each token's window through forward) ----
     * A generator serves rows 0..rows-1, each a sequence whose keys and values it caches
     * (up to cap tokens a row, act dtype: bf16 on a GPU, fp32 on the cpu), computing with
     * impl's ops, parameter source and matmul recipe: the forward's arithmetic, one
     * pass over the units (embedding, blocks, head) per call. Logits are host fp32, V per
     * row named, in the order named. */
    void *(*gen_create)(void *impl, int rows, int cap);
    void (*gen_destroy)(void *gen);
    /* Rows rows[0..n) (ascending, distinct) start over with prompts[i] (lens[i] tokens,
     * 1 <= lens[i] <= cap): their caches hold the prompts after it; logits gets each
     * one's next-token logits. Prompts of different lengths go together. */
    void (*gen_prefill)(void *gen, int n, const int *rows, const int32_t *const *prompts,
                        const int *lens, float *logits);
    /* Rows rows[0..n) (ascending, distinct; each holding fewer than cap tokens) take one
     * more token each, tokens[i], at their own next position; logits as gen_prefill's. */
    void (*gen_decode)(void *gen, int n, const int *rows, const int32_t *tokens,
                       float *logits);
    /* Bytes it allocated (what spec->generator_bytes counts). */
    size_t (*gen_bytes)(const void *gen);
} model_family;

/* ---- shapes ---- */
int model_shape_vocab_size(const model_shape *s);
int model_shape_max_seq_len(const model_shape *s);
int64_t model_shape_param_count(const model_shape *s);
double model_shape_flops_per_token(const model_shape *s, int T);
/* 0, or -1 with "[model] ..." in err (the family's validate). */
int model_shape_validate(const model_shape *s, char *err, size_t errlen);
/* The first of the family's keys with any of `flags` (0: every key) whose value differs
 * between a and b, or -1; shapes of two families are -2. */
int model_shape_diff(const model_shape *a, const model_shape *b, unsigned flags);
/* The engine's description of the shape (model_desc_close frees it); s must outlive it. */
void model_shape_desc_open(model_desc *d, const model_shape *s);

/* ---- options ---- */
/* Whether ops run the options' matmul recipe on this device: 0, or -1 with the reason
 * ("the cpu backend of this build has no FP8 matmul"). The one copy of that rule. */
int model_check_opts(const model_opts *o, const shlm_ops *ops, char *why, size_t whylen);

/* ---- models ---- */
typedef struct model model;
/* The model of shape s for micro-batches of at most B x T on ops over src. */
model *model_create(const model_shape *s, const shlm_ops *ops, int B, int T,
                    const model_opts *o, model_param_source src);
void model_destroy(model *m); /* NULL is fine */
const model_family *model_family_of(const model *m);
const model_shape *model_shape_of(const model *m);
double model_forward_backward(model *m, const model_batch *b, float grad_scale, int *n_valid);
double model_forward(model *m, const model_batch *b, int *n_valid, float *logits_out,
                     float *last_logits_out);
size_t model_activation_bytes(const model *m);
void model_set_profile(model *m, int on);
void model_take_profile(model *m, double *seconds);

/* ---- generators (the decode side; m must outlive its generator) ---- */
typedef struct model_gen model_gen;
/* m's generator of `rows` sequences of up to `cap` tokens each, or NULL when m's family
 * has none. */
model_gen *model_gen_create(model *m, int rows, int cap);
void model_gen_destroy(model_gen *g); /* NULL is fine */
int model_gen_rows(const model_gen *g);
int model_gen_cap(const model_gen *g);
void model_gen_prefill(model_gen *g, int n, const int *rows, const int32_t *const *prompts,
                       const int *lens, float *logits);
void model_gen_decode(model_gen *g, int n, const int *rows, const int32_t *tokens,
                      float *logits);
size_t model_gen_bytes(const model_gen *g);

#endif
