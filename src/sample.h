/* Text generation from a model in memory: greedy, or temperature + nucleus (top-p)
 * sampling over the byte vocabulary, with a sliding context window. */
#ifndef SHLM_SAMPLE_H
#define SHLM_SAMPLE_H

#include <stdint.h>

#include "src/llama.h"
#include "src/rng.h"

/* Index drawn from logits (V): argmax when temperature <= 0, else softmax(logits /
 * temperature) restricted to the smallest set of tokens whose mass reaches top_p. */
int sample_token(const float *logits, int V, float temperature, float top_p, rng_state *r);

/* Appends n_new tokens to the prompt's tokens, feeding at most max_ctx tokens of
 * context. out receives prompt + continuation (n_prompt + n_new ids). Every rank
 * must call it (the forward gathers parameters collectively); with the same seed
 * every rank draws the same tokens. */
void sample_generate(llama_model *m, int max_ctx, const int32_t *prompt, int n_prompt,
                     int n_new, float temperature, float top_p, uint64_t seed, int32_t *out);

#endif
