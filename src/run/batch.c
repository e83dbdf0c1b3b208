/* Host rows of a micro-batch (batch.h). */
#include "src/run/batch.h"

#include <stdlib.h>

#include "kernels/check.h"
#include "src/base/rng.h"

void batch_rows_alloc(batch_rows *b, const job_config *c) {
    const size_t n = (size_t)c->micro_batch * c->seq_len;
    b->n = n;
    b->inputs = malloc(n * sizeof(int32_t));
    b->targets = malloc(n * sizeof(int32_t));
    b->doc_start = c->doc_mask ? malloc(n * sizeof(int32_t)) : NULL;
    SHLM_CHECK_ALLOC(b->inputs);
    SHLM_CHECK_ALLOC(b->targets);
    if (c->doc_mask) SHLM_CHECK_ALLOC(b->doc_start);
    b->row_keys = NULL;
    if (c->lora.rank > 0 && c->lora.dropout > 0) {
        b->row_keys = malloc((size_t)c->micro_batch * sizeof(uint64_t));
        SHLM_CHECK_ALLOC(b->row_keys);
    }
}

void batch_rows_keys(batch_rows *b, const data_mix *dm, uint64_t seed, int m) {
    for (int r = 0; b->row_keys && r < dm->micro_batch; r++)
        b->row_keys[r] = rng_hash64(seed ^ rng_hash64(data_mix_sample(dm, m, r)));
}

void batch_rows_free(batch_rows *b) {
    free(b->inputs);
    free(b->targets);
    free(b->doc_start);
    free(b->row_keys);
}
