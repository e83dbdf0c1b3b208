/* The job's shard plan and the allocation check of fit.h. */
#include "src/job/fit.h"

#include <stdio.h>

#include "src/model/family.h"

job_point job_point_of(const job_config *c, fsdp_strategy strategy, int S, int R) {
    return (job_point){strategy, S, R, c->micro_batch, c->activation_checkpointing};
}

void job_plan_build(job_plan *jp, const job_config *c, const job_point *pt, shlm_dtype act,
                    const shlm_ops *ops, int forward_only, int registered_gathers) {
    model_shape_desc_open(&jp->md, &c->model);
    plan_params p = {.strategy = pt->strategy,
                     .S = pt->S,
                     .R = pt->R,
                     .act = act,
                     .param_dtype = c->param_dtype,
                     .reduce_dtype = c->reduce_dtype,
                     .forward_only = forward_only,
                     .B = pt->micro_batch,
                     .T = c->seq_len,
                     /* forward passes only: no block keeps activations for a backward
                      * (full's buffers: one block's scratch, the residual streams) */
                     .ac = forward_only ? MODEL_AC_FULL : pt->ac,
                     .matmul = c->matmul,
                     .ops = ops,
                     .registered_gathers = registered_gathers,
                     .fp8_all_gather = c->fp8_all_gather};
    shard_plan_build(&jp->plan, &jp->md, &p);
}

void job_plan_free(job_plan *jp) {
    shard_plan_free(&jp->plan);
    model_desc_close(&jp->md);
}

int fit_check_allocated(const shard_plan *plan, const size_t measured[PLAN_N_CATEGORIES],
                        int rank) {
    int bad = 0;
    for (int c = 0; c <= PLAN_ACTIVATIONS; c++)
        if (measured[c] != plan->bytes[c]) {
            printf("plan check: rank %d: %s allocated %zu bytes, the plan says %zu\n", rank,
                   plan_category_names[c], measured[c], plan->bytes[c]);
            bad++;
        }
    return bad;
}
