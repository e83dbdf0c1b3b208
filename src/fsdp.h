/* The FSDP engine: owns the sharded fp32 master weights, gradients and AdamW
 * moments of every unit, and serves the model gathered parameters (see DESIGN.md). */
#ifndef SHLM_FSDP_H
#define SHLM_FSDP_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "src/llama.h"
#include "src/optim.h"

typedef struct fsdp_options {
    shlm_dtype param_dtype;  /* dtype the gathered parameters are rounded to */
} fsdp_options;

typedef struct fsdp_engine fsdp_engine;

/* Creates the engine and initialises the parameters from `seed`. */
fsdp_engine *fsdp_create(const llama_config *mc, const shlm_ops *ops,
                         const fsdp_options *opt, uint64_t seed);
void fsdp_destroy(fsdp_engine *e);

/* The source the model pulls parameters from and pushes gradients to. */
llama_param_source fsdp_param_source(fsdp_engine *e);

/* Zeroes the gradients before the first micro-batch of a step. */
void fsdp_zero_grad(fsdp_engine *e);
/* Global L2 norm of the (reduced) gradient. */
double fsdp_grad_norm(fsdp_engine *e);
/* One AdamW step (1-based `step`) on every owned element, gradients scaled by
 * grad_scale (clipping); weight decay only on matrices. */
void fsdp_optimizer_step(fsdp_engine *e, float lr, float grad_scale, const adamw_hparams *h,
                         int step);
/* Bytes of sharded state on this rank: master weights, gradients and moments. */
size_t fsdp_state_bytes(const fsdp_engine *e);
/* Copies unit u's full fp32 master weights to host memory `out` (numel elements). */
void fsdp_get_unit(fsdp_engine *e, int u, float *out);
/* Overwrites unit u's master weights from host fp32 `in` (numel elements). */
void fsdp_set_unit(fsdp_engine *e, int u, const float *in);

#endif
