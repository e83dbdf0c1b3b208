/* The tests' shorthand over src/model/decoder.h: a forward pass's mean loss. */
#ifndef SHLM_TESTS_DECODER_TEST_H
#define SHLM_TESTS_DECODER_TEST_H

#include "src/model/decoder.h"

/* The mean loss over b's trained targets (their count in *n_valid, may be NULL); 0 when
 * there is none. logits_out, last_logits_out as decoder_forward's. */
static inline float decoder_forward_mean(decoder *m, const model_batch *b, int *n_valid,
                                         float *logits_out, float *last_logits_out) {
    int valid = 0;
    const double sum = decoder_forward(m, b, &valid, logits_out, last_logits_out);
    if (n_valid) *n_valid = valid;
    return valid > 0 ? (float)(sum / valid) : 0.0f;
}

#endif
