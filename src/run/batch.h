/* One micro-batch's host rows as the data loader fills them, for training and validation. */
#ifndef SHLM_BATCH_H
#define SHLM_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "src/data/data_mix.h"
#include "src/job/config.h"

/* One micro-batch's rows as the data loader fills them: inputs, targets and (with
 * data.doc_mask) each token's document start; micro_batch x seq_len int32 each. With LoRA
 * dropout, each row's dropout key (model_batch.row_keys: batch_rows_keys). */
typedef struct batch_rows {
    int32_t *inputs, *targets, *doc_start;
    size_t n; /* elements of each */
    uint64_t *row_keys; /* (micro_batch), or NULL */
} batch_rows;

/* Rows for c's micro_batch x seq_len (doc_start only with data.doc_mask). */
void batch_rows_alloc(batch_rows *b, const job_config *c);
void batch_rows_free(batch_rows *b);

/* The dropout keys of micro-batch m of dm's planned step (data_mix_step): row b's is a hash
 * of (train.seed, its global sample: data_mix_sample), the same on any world size and the
 * same whichever source of a mixture the row comes from. */
void batch_rows_keys(batch_rows *b, const data_mix *dm, uint64_t seed, int m);

#endif
