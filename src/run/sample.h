/* Text generation from a model in memory: greedy, or temperature + nucleus (top-p)
 * sampling, with a sliding context window, stop tokens, and the continuation decoded and
 * printed as it is generated. */
#ifndef SHLM_SAMPLE_H
#define SHLM_SAMPLE_H

#include <stdint.h>
#include <stdio.h>

#include "src/model/family.h"
#include "src/run/run.h"
#include "src/base/rng.h"
#include "src/tokenizer/tokenizer.h"

/* Index drawn from logits (V): argmax when temperature <= 0, else softmax(logits /
 * temperature) restricted to the smallest set of tokens whose mass reaches top_p. */
int sample_token(const float *logits, int V, float temperature, float top_p, rng_state *r);

/* Called with each new token, in order (optional). */
typedef void (*sample_token_fn)(void *ctx, int32_t id);

typedef struct sample_options {
    float temperature;       /* <= 0: greedy */
    float top_p;
    uint64_t seed;
    const int32_t *stop_ids; /* generation ends after any of these (it is kept in out) */
    int n_stop;
    sample_token_fn on_token;
    void *ctx;
} sample_options;

/* Appends up to n_new tokens to the prompt's tokens, feeding at most max_ctx tokens of
 * context; out receives prompt + continuation. Returns the number of new tokens (fewer
 * than n_new after a stop id). Every rank must call it (the forward gathers parameters
 * collectively); with the same seed every rank draws the same tokens. */
int sample_generate(model *m, int max_ctx, const int32_t *prompt, int n_prompt,
                    int n_new, const sample_options *o, int32_t *out);

/* sample_generate with the text printed to `out` as it comes (when out is not NULL: rank
 * 0 passes stdout, the others NULL): the prompt's text (special tokens shown), then the
 * continuation decoded incrementally with tok (special tokens left out; an id the
 * tokenizer cannot decode is printed as [id]). ids: tok cannot spell the model's ids (the
 * byte tokenizer under a vocabulary of another size): print ids, space-separated,
 * instead. o->on_token is overridden. Returns the number of new tokens. */
int sample_print(model *m, tokenizer *tok, int ids, int max_ctx, const int32_t *prompt,
                 int n_prompt, int n_new, const sample_options *o, FILE *out, int32_t *all);

/* The closing sample of a run (train.sample_*): the prompt encoded with the job's
 * tokenizer, the continuation printed as it comes, ending at an eos. Collective. */
void run_print_sample(run *r);

#endif
