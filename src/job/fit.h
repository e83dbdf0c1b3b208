/* The shard plan of a job (src/engine/shard_plan.h over its Llama model), built once for
 * `train`'s allocation and fit check and for `shardlm plan`, and the check that a run
 * allocated what its plan says. */
#ifndef SHLM_FIT_H
#define SHLM_FIT_H

#include <stddef.h>

#include "kernels/ops.h"
#include "src/job/config.h"
#include "src/engine/model.h"
#include "src/engine/shard_plan.h"

typedef struct job_plan {
    model_desc md;        /* the job's model (over c->model: the job must outlive it) */
    shard_plan plan;
} job_plan;

/* What one choice of the job's knobs is: the strategy, group sizes and micro-batch may
 * differ from the job's (plan's verdict tries others). */
typedef struct job_point {
    fsdp_strategy strategy;
    int S, R;
    int micro_batch;
    model_ac ac;
} job_point;

/* The job's own point: its strategy, micro-batch and checkpointing on groups S x R. */
job_point job_point_of(const job_config *c, fsdp_strategy strategy, int S, int R);

/* Builds the plan of job c at point pt on a backend of act dtype `act` (ops: the op
 * scratch and the arena's rounding; may be NULL). forward_only: eval and generate (no
 * gradient state; every block recomputed, so nothing is kept for a backward).
 * registered_gathers: the comm backend registers gathered buffers itself. */
void job_plan_build(job_plan *jp, const job_config *c, const job_point *pt, shlm_dtype act,
                    const shlm_ops *ops, int forward_only, int registered_gathers);
void job_plan_free(job_plan *jp);

/* The plan check of one rank: measured[c] against plan->bytes[c] for the engine's
 * categories and the activations (the op scratch is the backend's, measured on a device
 * by its memory's drop). Returns the number of categories that differ and prints one
 * line per difference ("plan check: rank R: CATEGORY allocated A bytes, the plan says P"). */
int fit_check_allocated(const shard_plan *plan, const size_t measured[PLAN_N_CATEGORIES],
                        int rank);

#endif
