/* What one rank needs on its device, the one sum both `train`'s fit check (before
 * anything is allocated) and `shardlm plan`'s verdict use. */
#ifndef SHLM_FIT_H
#define SHLM_FIT_H

#include <stddef.h>

#include "kernels/ops.h"
#include "src/fsdp.h"
#include "src/llama.h"

typedef struct fit_bytes {
    fsdp_plan_bytes pb;      /* the engine's part, fsdp_plan */
    size_t state;            /* master + gradient + moments */
    size_t buffers;          /* gathered + gradient buffers */
    size_t acts;             /* activations and their gradients */
    size_t scratch;          /* the ops' own scratch (0 without ops->scratch_bytes) */
    size_t total;
} fit_bytes;

/* The bytes of one rank for model m in act dtype with the strategy's shard and replica
 * group sizes S, R, micro-batches of B x T and checkpointing ac; ops (may be NULL) gives
 * the scratch. */
void fit_bytes_for(const llama_config *m, shlm_dtype act, fsdp_strategy strategy, int S, int R,
                   const fsdp_options *opt, int B, int T, llama_ac ac, const shlm_ops *ops,
                   fit_bytes *out);

#endif
