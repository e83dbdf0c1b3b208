/* Host rows of a micro-batch (batch.h). */
#include "src/run/batch.h"

#include <stdlib.h>

#include "kernels/check.h"

void batch_rows_alloc(batch_rows *b, const job_config *c) {
    const size_t n = (size_t)c->micro_batch * c->seq_len;
    b->n = n;
    b->inputs = malloc(n * sizeof(int32_t));
    b->targets = malloc(n * sizeof(int32_t));
    b->doc_start = c->doc_mask ? malloc(n * sizeof(int32_t)) : NULL;
    SHLM_CHECK_ALLOC(b->inputs);
    SHLM_CHECK_ALLOC(b->targets);
    if (c->doc_mask) SHLM_CHECK_ALLOC(b->doc_start);
}

void batch_rows_free(batch_rows *b) {
    free(b->inputs);
    free(b->targets);
    free(b->doc_start);
}
