/* The FSDP engine: owns each rank's shard of the fp32 master weights, gradients and
 * AdamW moments of every unit of a model (model.h) or, with LoRA, of the units' adapters
 * beside the frozen base's shards, and serves the model gathered parameters according to
 * the strategy (docs/engine.md "Strategies"): gather, keep, free, prefetch, reduce. What it
 * allocates and the order it prefetches in are the
 * shard plan's (shard_plan.h): the engine derives no size of its own. */
#ifndef SHLM_FSDP_H
#define SHLM_FSDP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/comm.h"
#include "kernels/ops.h"
#include "src/engine/model.h"
#include "src/engine/optim.h"
#include "src/engine/shard_plan.h"
#include "src/engine/topology.h"

/* The dtypes and forward_only are the plan's (plan_params). */
typedef struct fsdp_options {
    int prefetch;            /* 1: gather the next unit while the current one computes */
    int trace;               /* 1: record the schedule (fsdp_trace_write) */
    int defer_init;          /* 1: fsdp_create leaves the master weights zero, for a caller
                              * that loads every shard (import, resume) or calls
                              * fsdp_init_weights: a 1.1B init is ~40 core-seconds of RNG */
    /* The shard and replica groups (comm->group_create over topo->shard / topo->replica),
     * made by a caller that needs them before the engine: a device's communicators take
     * memory, which the fit check must see in use before the arena is sized. The engine
     * owns and frees them. NULL: fsdp_create makes them. */
    shlm_comm_group *shard_group, *replica_group;
} fsdp_options;

typedef struct fsdp_engine fsdp_engine;

/* Creates the engine of model md over the topology's shard and replica groups
 * (collective over the world), allocating what `plan` lists (shard_plan_build for this
 * topology's group sizes and the ops' act dtype; aborts naming both when they differ), and
 * initialises this rank's shards from `seed` (unless opt->defer_init). With
 * plan->p.forward_only (evaluation and sampling) no gradient, moment or gradient buffer
 * exists: grad() must not be called, nor the moments read or written. md and plan must
 * outlive the engine. */
fsdp_engine *fsdp_create(const model_desc *md, const shard_plan *plan, const shlm_ops *ops,
                         const shlm_comm *comm, const topology *topo, const fsdp_options *opt,
                         uint64_t seed);
/* Sets this rank's master shards to the initial values of `seed` (the family's
 * init_slice: the same model at every world size); with LoRA the frozen base's too, and the
 * adapters as fsdp_init_adapters. Local. */
void fsdp_init_weights(fsdp_engine *e, uint64_t seed);
/* LoRA: the adapters alone from `seed` (adapters_init_slice), over a base set otherwise
 * (imported). DoRA's magnitudes then need fsdp_lora_magnitudes. Local. */
void fsdp_init_adapters(fsdp_engine *e, uint64_t seed);
/* DoRA: every magnitude set to its projection's row norms ||W_j|| of the base as it is now
 * (PEFT's initialisation: B is zero, so the adapted model starts as the base). Collective
 * over the shard group (each unit is gathered once); a no-op without DoRA. */
void fsdp_lora_magnitudes(fsdp_engine *e);
void fsdp_destroy(fsdp_engine *e);

/* The source the model pulls parameters from and pushes gradients to. */
model_param_source fsdp_param_source(fsdp_engine *e);

/* Announces the next pass of the model so the engine can prefetch in its order:
 * with_backward = 0 for evaluation and sampling (forward only). */
void fsdp_begin_pass(fsdp_engine *e, int with_backward);

/* Starts a step's gradients: the first micro-batch's backward overwrites the shards. */
void fsdp_zero_grad(fsdp_engine *e);
/* The next backward is the step's last micro-batch: each unit's shard is final once
 * reduced, so its all-reduce across replicas starts during the backward (optional: without
 * it the all-reduces run in fsdp_finish_grads). */
void fsdp_last_micro_batch(fsdp_engine *e);
/* Completes the gradient reduction of the step (outstanding reduce-scatters, then the
 * all-reduce across replicas) and returns the global L2 norm of the gradient. */
double fsdp_finish_grads(fsdp_engine *e);
/* One AdamW step (1-based `step`) on this rank's shards, gradients scaled by
 * grad_scale (clipping); weight decay only on matrices. Offloaded (plan->offload) on the
 * host, unit by unit, each unit's device copy refreshed once updated. */
void fsdp_optimizer_step(fsdp_engine *e, float lr, float grad_scale, const adamw_hparams *h,
                         int step);

/* Bytes fsdp_create allocated on this rank per category of the plan (PLAN_MASTER ..
 * PLAN_GRAD_BUFFERS), measured by the backend's own count (ops->allocated_bytes) where it
 * keeps one, plus buffers the comm backend registered: what the plan check compares with
 * plan->bytes. */
void fsdp_measured_bytes(const fsdp_engine *e, size_t out[PLAN_N_ENGINE]);
/* Host bytes the optimizer offload allocated on this rank (0 without it): what the plan's
 * host_bytes says. */
size_t fsdp_host_bytes(const fsdp_engine *e);
/* Counters of the shard and replica groups' collectives on this rank; blocked_ns is the
 * time spent waiting on them, not hidden by compute (exposed comm). */
void fsdp_comm_stats(const fsdp_engine *e, shlm_comm_stats *shard, shlm_comm_stats *replica);

/* What a checkpoint holds and an optimizer steps is the trained state: the model's tensors
 * (full training), or with LoRA the adapters (fsdp_layout: model_desc_trained). A unit with
 * nothing trained (LoRA: no adapter) has an empty shard there. */
/* This rank's shard of unit u's trained flat buffer: [*begin, *end) of it, padded. */
void fsdp_shard_range(const fsdp_engine *e, int u, size_t *begin, size_t *end);
/* The per-rank fp32 state a checkpoint holds, shard by shard. */
typedef enum fsdp_state_kind {
    FSDP_STATE_MASTER = 0,  /* master weights */
    FSDP_STATE_EXP_AVG,     /* AdamW first moment */
    FSDP_STATE_EXP_AVG_SQ,  /* AdamW second moment */
    FSDP_STATE_N
} fsdp_state_kind;

/* Copies this rank's shard of unit u's state `kind` to host `out` (shard length). */
void fsdp_get_state(fsdp_engine *e, int u, fsdp_state_kind kind, float *out);
/* The same, queued where the backend copies asynchronously (ops->to_host_async: out must
 * then be ops->host_alloc memory) and landed by fsdp_get_state_wait; else at once. */
void fsdp_get_state_async(fsdp_engine *e, int u, fsdp_state_kind kind, float *out);
void fsdp_get_state_wait(fsdp_engine *e);
/* Overwrites this rank's shard of unit u's state `kind` from host `in`. */
void fsdp_set_state(fsdp_engine *e, int u, fsdp_state_kind kind, const float *in);
/* Shorthands for the master weights. */
void fsdp_get_shard(fsdp_engine *e, int u, float *out);
void fsdp_set_shard(fsdp_engine *e, int u, const float *in);
/* The layout of the trained state (units and tensors under Hugging Face names). */
const model_layout *fsdp_layout(const fsdp_engine *e);

/* ---- the base: the model's own tensors, trained (full training: the same as above) or
 * frozen (LoRA: stored in fsdp.param_dtype; QLoRA: a unit with projections as NF4 blocks,
 * src/engine/base_nf4.h) ---- */
int fsdp_lora(const fsdp_engine *e); /* 1: the base is frozen, the adapters train */
const model_layout *fsdp_base_layout(const fsdp_engine *e);
/* The range of unit u's flat buffer that fsdp_set_base_shard takes on this rank: its
 * shard, or for a unit stored as NF4 the whole unit (every rank quantizes each matrix whole
 * and keeps its quanta: the codes one rank would make). */
void fsdp_base_shard_range(const fsdp_engine *e, int u, size_t *begin, size_t *end);
/* This rank's shard of unit u's base as host fp32 (a bf16 store widened), and set from
 * that range (a frozen store rounds to param_dtype, to nearest even; an NF4 unit
 * quantizes). Local. A unit stored as NF4 has no such shard to read: get aborts on it. */
void fsdp_get_base_shard(fsdp_engine *e, int u, float *out);
void fsdp_set_base_shard(fsdp_engine *e, int u, const float *in);
/* A 64-bit fingerprint of the base as stored: Σ hash(i, bits of x_i) over every element i
 * of the model (layout order), and for a unit stored as NF4 its codes and scales as stored
 * (base_nf4_fingerprint: the same bits give the same values on every backend), modulo
 * 2^64, the same at every world size and strategy. Collective over the shard group. */
uint64_t fsdp_base_fingerprint(fsdp_engine *e);

/* Schedule trace: one JSON object per event ({"seq", "t_us", "unit", "event"}) with
 * events gather_issue, gather_wait, compute, release, free, reduce_issue, reduce_done.
 * No-op unless opt->trace. */
void fsdp_trace_write(const fsdp_engine *e, FILE *out);

#endif
