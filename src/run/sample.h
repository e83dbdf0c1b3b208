/* Text generation from a model in memory: greedy, or temperature + nucleus (top-p)
 * sampling, of many sequences at once through the model's KV-cache generator (a prompt fed
 * once, then one token a sequence a step), stop tokens, and the text printed as it comes.
 * A sequence that outgrows the generator's cache, and every sequence when there is no
 * generator, recompute their window (the last max_ctx tokens) through the forward for each
 * token: the documented fallback (`generate --recompute`), and the reference the cache is
 * checked against. */
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

/* A sequence to continue, and what comes after its prompt. */
typedef struct sample_seq {
    const int32_t *prompt;
    int n_prompt;    /* >= 1 */
    int32_t *out;    /* room for n_prompt + n_new: the prompt, then the continuation */
    int n_gen;       /* tokens generated (set by sample_generate) */
    int stopped;     /* the last of them is a stop id */
} sample_seq;

/* Called with each new token of sequence i, in order (optional). */
typedef void (*sample_token_fn)(void *ctx, int i, int32_t id);
/* Called when sequence i is complete (optional). */
typedef void (*sample_end_fn)(void *ctx, int i);

typedef struct sample_options {
    float temperature;       /* <= 0: greedy */
    float top_p;
    uint64_t seed;           /* sequence i draws from rng_seed(seed + i)'s stream */
    const int32_t *stop_ids; /* a sequence ends after any of these (it is kept in out) */
    int n_stop;
    sample_token_fn on_token;
    sample_end_fn on_end;
    void *ctx;
} sample_options;

/* Continues each of seqs[0, n) by up to n_new tokens. With gen, its rows take the
 * sequences in order, the next one starting in a row as soon as a sequence ends; a
 * sequence's logits come from the cache while it holds at most the cache's tokens, then
 * from its window of max_ctx tokens through m's forward (micro-batches of one sequence of
 * at most max_ctx tokens: m's capacity). Without gen, every token from the window, one
 * sequence after another. Every rank calls it with the same arguments (the forward
 * gathers parameters collectively); every rank takes rank 0's tokens. */
void sample_generate(model *m, model_gen *gen, int max_ctx, sample_seq *seqs, int n, int n_new,
                     const sample_options *o);

/* sample_generate of one prompt with the text printed to `out` as it comes (when out is
 * not NULL: rank 0 passes stdout, the others NULL): the prompt's text (special tokens
 * shown), then the continuation decoded incrementally with tok (special tokens left out;
 * an id the tokenizer cannot decode is printed as [id]). ids: tok cannot spell the model's
 * ids (the byte tokenizer under a vocabulary of another size): print ids, space-separated,
 * instead. o's callbacks are not called. all: room for n_prompt + n_new. Returns the
 * number of new tokens. */
int sample_print(model *m, model_gen *gen, tokenizer *tok, int ids, int max_ctx,
                 const int32_t *prompt, int n_prompt, int n_new, const sample_options *o,
                 FILE *out, int32_t *all);

/* The closing sample of a run (train.sample_*): the prompt encoded with the job's
 * tokenizer, the continuation printed as it comes, ending at an eos, through the run's
 * generator. Collective. */
void run_print_sample(run *r);

#endif
