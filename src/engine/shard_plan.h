/* The shard plan: every rule of the engine's memory and schedule, worked out once from
 * the model (model.h) and the topology's group sizes before anything is allocated. It is
 * what fsdp_create allocates (the per-unit shard and buffer sizes, the slots), what the
 * model's activations and the ops' scratch add, what `shardlm plan` prints, what the fit
 * check compares with the device, what the device arena is sized from, and the schedule
 * the engine follows (which unit comes next in a pass, which release keeps a unit). */
#ifndef SHLM_SHARD_PLAN_H
#define SHLM_SHARD_PLAN_H

#include <stddef.h>

#include "kernels/ops.h"
#include "src/engine/base_nf4.h"
#include "src/engine/model.h"
#include "src/engine/topology.h"

enum { PLAN_SLOTS = 2 }; /* gathered-unit and gradient slots of FULL_SHARD / HYBRID_SHARD */
/* fp8_weights: each FP8 matrix's scale_inv sits on 16 bytes of its own (floats apart):
 * cuBLASLt's FP8 products take scale pointers 16-byte aligned */
enum { PLAN_FP8_SCALE_STRIDE = 4 };

/* Where a rank's bytes go. The engine's categories are allocated by fsdp_create, the
 * activations by the model, the op scratch by the backend (ops->scratch_reserve). */
typedef enum plan_category {
    PLAN_MASTER = 0,   /* fp32 master weights (shard) of what trains; 0 offloaded */
    PLAN_GRAD,         /* fp32 gradient (shard) */
    PLAN_MOMENTS,      /* AdamW exp_avg + exp_avg_sq (shard); 0 offloaded */
    PLAN_FROZEN,       /* LoRA: the frozen base (shard, fsdp.param_dtype; with NF4 the
                        * blocks of base_nf4.h) */
    PLAN_PARAM_COPY,   /* offload: the trained shard in offload_dtype, which the gather
                        * reads (the master is in host memory) */
    PLAN_GATHERED,     /* gathered-parameter buffers (act dtype): per unit or PLAN_SLOTS;
                        * with NF4 and S > 1 also PLAN_SLOTS buffers of S blocks */
    PLAN_GRAD_BUFFERS, /* full-unit fp32 gradient slots, their bf16 staging, the bf16
                        * staging of the replica all-reduce */
    PLAN_ACTIVATIONS,  /* the model's activations and their gradients (and FP8's operand
                        * buffers), and a KV-cache generator's caches and step buffers */
    PLAN_OP_SCRATCH,   /* the ops' own scratch and the matmul library's workspace */
    PLAN_N_CATEGORIES
} plan_category;
enum { PLAN_N_ENGINE = PLAN_GRAD_BUFFERS + 1 }; /* categories fsdp_create allocates */

/* The names `shardlm plan` and the run's memory line print ("master_bytes", ...). */
extern const char *const plan_category_names[PLAN_N_CATEGORIES];

/* What the plan is made for. */
typedef struct plan_params {
    fsdp_strategy strategy;
    int S, R;                 /* shard and replica group sizes (topology_group_sizes) */
    shlm_dtype act;           /* the backend's activation dtype */
    shlm_dtype param_dtype;   /* gathered parameters are rounded to this */
    shlm_dtype reduce_dtype;  /* gradients are reduced in this */
    int forward_only;         /* evaluation and sampling: no gradient or moment state */
    int B, T;                 /* micro-batch capacity */
    model_ac ac;              /* activation checkpointing */
    model_matmul matmul;      /* the blocks' matmul recipe (FP8 adds its operand buffers) */
    const shlm_ops *ops;      /* sizes the op scratch (NULL: none counted) and the arena's
                               * per-buffer rounding (ops->alloc_align) */
    int registered_gathers;   /* the comm backend registers gathered buffers itself (they
                               * are not carved from the arena); only with S > 1 */
    int fp8_all_gather;       /* fsdp.fp8_all_gather: the gather makes the FP8 matrices'
                               * codes where it applies (shard_plan.fp8_weights) */
    int hold;                 /* generation: every unit is gathered once and kept until the
                               * master changes (a buffer per unit whatever the strategy, no
                               * release frees one), so a decode step gathers nothing */
    int offload;              /* fsdp.offload = optimizer: the master and the moments in
                               * host memory, AdamW on the host (src/engine/offload.h);
                               * nothing to offload without a gradient (forward_only) */
    int gen_rows, gen_cap;    /* a KV-cache generator of gen_rows sequences of up to gen_cap
                               * tokens (model_spec.generator_bytes, counted with the
                               * activations); 0 rows: none */
} plan_params;

/* One unit's sizes: its flat buffer of the model's tensors (the base), and with LoRA its
 * adapters' flat buffer (model.h "LoRA"), each padded and sharded on its own. Gathered, the
 * unit is one act buffer [base (padded) | adapters (a_padded)]. */
typedef struct plan_unit {
    size_t numel;   /* logical flat length */
    size_t padded;  /* padded for the shard group (shard_padded_size) */
    size_t shard;   /* elements each rank owns: padded / S */
    size_t a_numel, a_padded, a_shard; /* the adapters' (0: none) */
} plan_unit;

/* The schedule of one pass (model_pass) as the engine runs it, indexed by
 * unit * 3 + phase: the unit asked for next (-1: none), and whether releasing the unit
 * in that phase keeps it gathered. */
typedef struct plan_pass {
    int *next;
    unsigned char *keep;
} plan_pass;

typedef struct shard_plan {
    plan_params p;
    int n_units;
    plan_unit *units;
    size_t max_padded;  /* the largest gathered unit (padded + a_padded), act elements */
    size_t max_grad_padded, max_shard; /* the largest trained flat buffer, padded and its
                                        * shard */
    int lora;           /* the base is frozen and the adapters train (model_desc_lora) */
    base_nf4_unit *nf4; /* lora.base_dtype = nf4: each unit's stored base (a unit with
                         * n_nf4 = 0 is stored and gathered as without NF4); NULL: none */
    size_t nf4_staging; /* nf4 with S > 1: the bytes of the S blocks of the largest one,
                         * what one gather of an NF4 unit lands in (PLAN_SLOTS of them) */
    int direct;         /* one shard, fp32 everywhere: the master (a frozen base's store)
                         * is the gathered unit */
    int keep_gathered;  /* SHARD_GRAD_OP, NO_SHARD, p.hold: one gathered buffer per unit */
    int gather_slots;   /* shared gathered buffers (PLAN_SLOTS or 0), max_padded each */
    int grad_slots;     /* full-unit gradient slots (PLAN_SLOTS or 0), max_grad_padded
                         * each */
    int grad_staging;   /* each grad slot has a bf16 staging buffer */
    int replica_staging;/* one bf16 buffer of max_shard for the replica all-reduce */
    int fp8_weights;    /* the gather makes the model's FP8 matrices (model.h fp8) as E4M3
                         * codes from the master: p.fp8_all_gather with matmul =
                         * fp8-tensorwise, gather slots and a model that has FP8 matrices
                         * and trains them (a frozen base has no fp32 master to make them
                         * from: its gathered bf16 weights are quantized in the products).
                         * Each slot then has a code buffer of max_padded bytes, and the
                         * engine an amax and a scale_inv float per FP8 matrix */
    int n_fp8;          /* FP8 matrices of all units */
    size_t fp8_rest;    /* fp8_weights with S > 1: the most elements of any rank's shard of
                         * a unit with FP8 matrices that lie outside them (its norms, biases), which
                         * the gather carries in act dtype: each slot stages S of these */
    int offload;        /* p.offload and a gradient: master and moments in host memory */
    shlm_dtype offload_dtype; /* the device's copy of the trained shard: p.param_dtype, or
                               * fp32 where the gather makes FP8 codes from it
                               * (fp8_weights: the cast takes fp32) */
    size_t host_bytes;  /* offload: host memory per rank, page-locked on a device: master,
                         * exp_avg, exp_avg_sq (the trained shards, fp32), two gradient
                         * shards in flight from the device (max_shard fp32 each) and, with a
                         * bf16 copy, its two upload stagings (max_shard bf16 each) */
    plan_pass pass[2];  /* [0] forward only, [1] forward and backward */
    size_t bytes[PLAN_N_CATEGORIES];
    size_t state;       /* master + grad + moments + frozen + param copy (on the device) */
    size_t buffers;     /* gathered + grad buffers */
    size_t total;       /* every category */
    size_t registered;  /* of PLAN_GATHERED: buffers the comm backend registers */
    size_t gen_bytes;   /* of PLAN_ACTIVATIONS: the KV-cache generator's (p.gen_rows) */
    size_t arena;       /* what the backend's arena holds: every engine and activation
                         * buffer rounded to ops->alloc_align, registered ones excepted */
    size_t shard_wire_per_micro;  /* bytes a rank sends in the shard group per micro-batch
                                   * (all-gathers + reduce-scatters, ring algorithms) */
    size_t replica_wire_per_step; /* replica all-reduce of the gradient shards per step */
} shard_plan;

/* The trained flat buffer of unit u: its base (full training) or its adapters (LoRA), as
 * (numel, padded, shard); all 0 when nothing of the unit trains. */
void shard_plan_trained(const shard_plan *plan, int u, size_t *numel, size_t *padded,
                        size_t *shard);

/* A run of a unit's flat buffer: elements [offset, offset + count). */
typedef struct plan_piece {
    size_t offset, count;
} plan_piece;
enum { PLAN_MAX_REST_PIECES = MODEL_MAX_FP8_WEIGHTS + 1 };
/* The runs of [begin, end) inside unit lu's tensors (padding excluded) and outside its FP8
 * matrices, in order, into out (at most PLAN_MAX_REST_PIECES); returns their number. */
int shard_plan_rest_pieces(const model_unit *lu, size_t begin, size_t end, plan_piece *out);

/* Fills *plan for model m (its layout and passes) with params p. Pure: allocates only
 * the plan's own tables (shard_plan_free). */
void shard_plan_build(shard_plan *plan, const model_desc *m, const plan_params *p);
void shard_plan_free(shard_plan *plan);

/* The plan's schedule: the unit after (u, phase) in the pass, and whether releasing
 * (u, phase) keeps the unit gathered. */
int shard_plan_next(const shard_plan *plan, int with_backward, int u, model_phase phase);
int shard_plan_keeps(const shard_plan *plan, int with_backward, int u, model_phase phase);

#endif
