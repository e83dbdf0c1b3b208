/* One micro-batch's host rows as the data loader fills them, for training and validation. */
#ifndef SHLM_BATCH_H
#define SHLM_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "src/job/config.h"

/* One micro-batch's rows as the data loader fills them: inputs, targets and (with
 * data.doc_mask) each token's document start; micro_batch x seq_len int32 each. */
typedef struct batch_rows {
    int32_t *inputs, *targets, *doc_start;
    size_t n; /* elements of each */
} batch_rows;

/* Rows for c's micro_batch x seq_len (doc_start only with data.doc_mask). */
void batch_rows_alloc(batch_rows *b, const job_config *c);
void batch_rows_free(batch_rows *b);

#endif
