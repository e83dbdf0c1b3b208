/* What the FSDP engine and the shard plan know of a model: its units (one flat buffer
 * each, the unit of sharding, gathering and reduction) and their tensors under Hugging
 * Face names with decay flags, the order a pass asks for units in, the initial values,
 * the activation bytes and op scratch of a micro-batch, and the source the model pulls
 * gathered units from and pushes gradients to. A model family (src/model/llama/llama.c) implements
 * model_spec; the engine includes no family's header. */
#ifndef SHLM_MODEL_H
#define SHLM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

/* ---- parameter layout ---- */
/* The projections a LoRA adapter may attach to (lora.targets): a family marks each of its
 * linear layers' weights with one (model_tensor.target), so adapters reach every family's
 * layers through its layout. */
typedef enum model_target {
    MODEL_TARGET_NONE = -1,
    MODEL_TARGET_Q = 0, MODEL_TARGET_K, MODEL_TARGET_V, MODEL_TARGET_O,
    MODEL_TARGET_GATE, MODEL_TARGET_UP, MODEL_TARGET_DOWN,
    MODEL_N_TARGETS
} model_target;
/* lora.targets' words: "q" "k" "v" "o" "gate" "up" "down" */
extern const char *const model_target_names[MODEL_N_TARGETS];

/* a decoder block: 9 tensors, and 3 biases with qkv_bias; a block's adapters: A, B and a
 * DoRA magnitude for each of its 7 projections */
enum { MODEL_MAX_UNIT_TENSORS = 3 * MODEL_N_TARGETS };

typedef struct model_tensor {
    char name[96];     /* Hugging Face name, e.g. model.layers.0.self_attn.q_proj.weight */
    int ndim;          /* 1 or 2 */
    int64_t shape[2];  /* HF shape */
    size_t offset;     /* element offset inside its unit's flat buffer */
    size_t numel;
    int weight_decay;  /* 1: AdamW decays it (matrices); 0: it does not (norm weights,
                        * biases, DoRA magnitudes) */
    int target;        /* the projection this weight is (model_target), or
                        * MODEL_TARGET_NONE */
} model_tensor;

/* A product of the unit: elements [offset, offset + rows·cols) of its unit's flat buffer,
 * row-major rows x cols (out x in), one or more consecutive tensors (q, k and v make one)
 * multiplied as one matrix: what an FP8 recipe (train.matmul = fp8-*) quantizes with one
 * scale (tensorwise), and what LoRA groups a unit's adapters by (lora_product). */
enum { MODEL_MAX_FP8_WEIGHTS = 4 };
typedef struct model_fp8_weight {
    size_t offset;
    int rows, cols;
} model_fp8_weight;

typedef struct model_unit {
    int n_tensors;
    model_tensor tensors[MODEL_MAX_UNIT_TENSORS];
    int n_fp8;       /* its FP8 matrices (0: none) */
    model_fp8_weight fp8[MODEL_MAX_FP8_WEIGHTS];
    size_t numel;    /* unpadded element count of the unit's flat buffer */
    int grad_writes; /* grad() .. grad_ready() pairs a backward makes on this unit per
                      * micro-batch (2 for a unit two parts of the model use, e.g. a tied
                      * embedding; else 1) */
} model_unit;

typedef struct model_layout {
    int n_units;
    model_unit *units;
    size_t total_numel;
} model_layout;

void model_layout_free(model_layout *lay);

/* ---- passes ----
 * Which pass is asking for a unit: FWD the trunk's forward, BWD a unit's backward, HEAD
 * the output (final norm, logits, loss and, in training, their backward). */
typedef enum model_phase { MODEL_FWD = 0, MODEL_BWD = 1, MODEL_HEAD = 2 } model_phase;

/* One acquire of a pass: unit `unit` in phase `phase`. */
typedef struct model_use {
    int unit;
    model_phase phase;
} model_use;

/* Every acquire of one micro-batch's pass, in the order the model makes them. The engine
 * prefetches the next entry, and SHARD_GRAD_OP keeps a unit gathered from a forward use
 * to the next use of the same unit in the pass. */
typedef struct model_pass {
    int n;
    model_use *uses;
} model_pass;

/* ---- activation checkpointing: what a block keeps from its forward for its backward.
 * NONE keeps everything; SELECTIVE keeps the block input and the matmul outputs and
 * recomputes the rest; FULL keeps only the block input. ---- */
typedef enum model_ac { MODEL_AC_NONE = 0, MODEL_AC_FULL = 1, MODEL_AC_SELECTIVE = 2 } model_ac;

/* ---- the matmul recipe of the transformer blocks' linear layers (train.matmul): the
 * backend's act dtype (BF16: bf16 on cuda, fp32 on cpu), or FP8 with tensorwise or rowwise
 * dynamic scaling (src/model/fp8_linear.h). The embedding and the output projection are never
 * FP8. ---- */
typedef enum model_matmul {
    MODEL_MATMUL_BF16 = 0,
    MODEL_MATMUL_FP8_TENSORWISE = 1,
    MODEL_MATMUL_FP8_ROWWISE = 2
} model_matmul;

/* ---- where the model gets parameters from ----
 * The model asks for "unit u's parameters, gathered" and hands back "unit u's
 * gradients": the FSDP engine decides what to gather, keep, free, prefetch and reduce. */
typedef struct model_param_source {
    void *ctx;
    /* Unit u's full parameters (act dtype, unit layout), valid until release(). */
    const void *(*acquire)(void *ctx, int u, model_phase phase);
    /* The model is done reading unit u's parameters in this phase. */
    void (*release)(void *ctx, int u, model_phase phase);
    /* Optional (NULL without LoRA): unit u's adapters (its adapter unit's layout, act
     * dtype), gathered with its parameters by acquire(), valid until release(). */
    const void *(*adapter)(void *ctx, int u);
    /* Unit u's full fp32 gradient buffer, valid from the first call in a backward until
     * grad_ready(): of the unit's tensors, or with LoRA of its adapters (a unit without
     * adapters then has none: grad() is not called for it). *overwrite = 0: the backward
     * pass adds into it (+=); 1: it holds nothing to keep, and the backward writes every
     * element of the unit once (=), which spares the source a zeroing pass and the
     * products a read. A unit with grad_writes = 2 goes through grad() .. grad_ready()
     * twice per micro-batch: the source sums both parts. */
    float *(*grad)(void *ctx, int u, int *overwrite);
    /* The backward pass has finished writing unit u's gradient (one of its grad_writes
     * parts) for this micro-batch. */
    void (*grad_ready)(void *ctx, int u);
    /* Optional (may be NULL): called between the ops of a unit so collectives in flight
     * advance while the model computes (MPI progresses inside MPI calls). */
    void (*progress)(void *ctx);
    /* Optional (may be NULL): 1 when every unit is gathered and stays so until the weights
     * change (generation's hold, or one fp32 shard used in place): acquire, adapter and
     * release then queue no device work and return the same pointers on every pass, so a
     * caller may record a pass (ops.h graph_begin) and replay it while the weights stay. */
    int (*held)(void *ctx);
    /* Optional (NULL, or returning NULL: the model quantizes the acquired weights itself):
     * unit u's FP8 matrix k (the layout's fp8[k]) as E4M3 codes with one tensorwise scale,
     * bit for bit what fp8_quantize of the acquired act-dtype matrix gives, valid from
     * acquire() to release() of u. Where it returns a matrix, the act-dtype buffer
     * acquire() returned does not hold that matrix's elements. */
    const shlm_fp8_matrix *(*fp8_weight)(void *ctx, int u, int k);
} model_param_source;

/* ---- LoRA: low-rank adapters over a frozen base (src/engine/adapters.h) ----
 * With lora.rank > 0 every parameter of the model's layout (the base) is frozen: no
 * gradient, no moments, no fp32 master; it is stored sharded in fsdp.param_dtype and gathered
 * per unit as in full training. What trains are the adapters: unit u's adapter tensors form
 * a second flat buffer of the same unit (model_desc.adapters.units[u]), with an fp32 master,
 * gradient and AdamW moments, sharded and reduced as a full fine-tune's units are, so no flat
 * buffer mixes frozen and trained elements. A targeted projection W (out x in) gets
 * A (r x in), B (out x r) and with DoRA a magnitude m (out); its output becomes
 * W·x + scale·B·A·dropout(x), or with DoRA (m / ||W + scale·B·A||_row) ⊙ (W·x + scale·B·A·x),
 * scale = alpha / r (alpha / √r with rslora). */
typedef struct lora_config {
    int rank;          /* r; 0: off */
    float alpha;
    float dropout;     /* probability of zeroing an adapter's input element (training) */
    unsigned targets;  /* 1 << model_target per adapted projection */
    int rslora;        /* scale alpha / √r */
    int dora;          /* a trained magnitude per output row */
    int base_nf4;      /* lora.base_dtype = nf4 (QLoRA): the projections' weights are stored
                        * and gathered as NF4 (src/engine/base_nf4.h), the rest of the base in
                        * fsdp.param_dtype */
    int double_quant;  /* with base_nf4: the NF4 absmaxes quantized again (kernels/nf4.h) */
} lora_config;

/* One adapted projection inside a fused product (model_fp8_weight: q|k|v, o, gate|up,
 * down). */
typedef struct lora_site {
    int target;        /* model_target */
    int tensor;        /* the base weight's index in its unit */
    int row0, rows;    /* its rows of the product's output */
    int a, b, m;       /* its A, B and magnitude's indices in the adapter unit (m: -1
                        * without DoRA) */
} lora_site;
enum { LORA_MAX_SITES = 3 }; /* q, k and v share a product */
/* The adapted projections of one product, their A's consecutive in the adapter unit (one
 * (n_sites·r) x cols matrix: the product of every A in one GEMM). */
typedef struct lora_product {
    int n_sites;       /* 0: the product has no adapter */
    lora_site sites[LORA_MAX_SITES];
} lora_product;

/* ---- a model family: functions of its shape `cfg` (the family's config struct) ---- */
typedef struct model_spec {
    const char *name;
    /* The units and their tensors (model_layout_free frees it). */
    void (*layout)(const void *cfg, model_layout *out);
    /* The acquires of a pass over one micro-batch, with or without its backward
     * (out->uses malloc'd; model_desc_close frees them). */
    void (*pass)(const void *cfg, const model_layout *lay, int with_backward, model_pass *out);
    /* Writes the initial values of elements [begin, end) of unit u's flat buffer into out
     * (host fp32, end-begin elements; padding past the unit's tensors is 0). A pure
     * function of (seed, unit, element): every world size gets the same model. */
    void (*init_slice)(const model_layout *lay, const void *cfg, uint64_t seed, int u,
                       size_t begin, size_t end, float *out);
    /* Bytes the family's model allocates through ops->alloc for micro-batches of B x T
     * with checkpointing ac, matmul recipe mm (FP8's operand buffers included) and LoRA
     * adapters lora (NULL: none; their products' buffers), each buffer rounded up to
     * `align` bytes (1: as requested). */
    size_t (*activation_bytes)(const void *cfg, shlm_dtype act, int B, int T, model_ac ac,
                               model_matmul mm, const lora_config *lora, size_t align);
    /* What the backend's ops allocate for themselves running this model at B x T
     * (ops->scratch_bytes at the family's op shapes; 0 when the backend has none). */
    size_t (*op_scratch_bytes)(const void *cfg, const shlm_ops *ops, int B, int T);
    /* Bytes the family's KV-cache generator (src/model/family.h's decode side) allocates
     * through ops->alloc for `rows` sequences of up to `cap` tokens each, its caches
     * included, each buffer rounded up to `align` bytes. */
    size_t (*generator_bytes)(const void *cfg, shlm_dtype act, int rows, int cap, size_t align);
} model_spec;

/* A family over one shape, with its layout and passes made once. */
typedef struct model_desc {
    const model_spec *spec;
    const void *cfg;        /* not owned: lives as long as the model_desc */
    model_layout lay;
    model_pass train_pass;  /* forward and backward of one micro-batch */
    model_pass eval_pass;   /* forward only */
    /* LoRA (adapters_open): the configuration, each unit's adapter tensors (a unit
     * without any has none; n_units 0 without LoRA) and each unit's products' sites
     * (lora_products[u][k] for the layout's fp8[k]) */
    lora_config lora;
    model_layout adapters;
    lora_product (*lora_products)[MODEL_MAX_FP8_WEIGHTS];
} model_desc;

/* Whether the description's base is frozen (LoRA on). */
static inline int model_desc_lora(const model_desc *m) { return m->lora.rank > 0; }
/* The layout of what trains: the adapters with LoRA, else the model's own. */
static inline const model_layout *model_desc_trained(const model_desc *m) {
    return model_desc_lora(m) ? &m->adapters : &m->lay;
}

void model_desc_open(model_desc *m, const model_spec *spec, const void *cfg);
void model_desc_close(model_desc *m);

#endif
