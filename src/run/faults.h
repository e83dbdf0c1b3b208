/* The training loop's test hooks, kept out of its body: the loop asks, at named points,
 * whether a hook acts there. */
#ifndef SHLM_FAULTS_H
#define SHLM_FAULTS_H

#include <stddef.h>

#include "src/engine/fsdp.h"

/* Test hook SHLM_TEST_NONFINITE=WHAT:FIRST[-LAST][:RANK], WHAT = loss | norm | weights:
 * on world rank RANK (default 0), in 1-based steps FIRST..LAST, the rank's loss or its
 * gradient norm reads NaN, or (weights) its shard of the embedding is set to NaN right
 * after the update, as if the arithmetic had overflowed there. For the tests of
 * train.on_nonfinite and of the save's refusal of non-finite tensors. */
typedef enum nonfinite_target { NF_NONE, NF_LOSS, NF_NORM, NF_WEIGHTS } nonfinite_target;
typedef struct nonfinite_hook {
    nonfinite_target what;
    int first, last;
} nonfinite_hook;

/* This rank's hook from the environment (none when unset); -1 with err for a malformed one. */
int nonfinite_hook_get(int rank, nonfinite_hook *h, char *err, size_t errlen);
/* 1 when the hook makes target t non-finite in (1-based) step. */
int nonfinite_hook_hits(const nonfinite_hook *h, nonfinite_target t, int step);
/* NF_WEIGHTS: every element of this rank's shard of unit 0 (the embedding) becomes NaN. */
void nonfinite_poison_embedding(fsdp_engine *e);

#endif
