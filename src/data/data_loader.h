/* Gives each data-parallel rank its own training sequences. The data is cut into
 * windows of seq_len+1 tokens (window w starts at token w·seq_len); the position of
 * the whole run is one global sample index, so it survives a change of world size.
 *
 * Global sample g maps to window perm_epoch(g mod n_windows), epoch = g / n_windows,
 * where perm is the identity (shuffle off) or a permutation drawn from (seed, epoch).
 * Optimizer step s covers samples [s·G, (s+1)·G) of a global batch G; inside it,
 * micro-batch m, row b of rank r of W takes sample s·G + (m·mb + b)·W + r: with
 * shuffle off, rank r takes windows r, r+W, r+2W, ...
 *
 * Packing: the file's documents are concatenated (token file v2 marks where each starts)
 * and cut into windows like any stream, as llama-recipes packs. A target whose loss-mask
 * bit is 0 (a prompt, a user turn) becomes -1, which the loss ignores. With doc_mask, each
 * row also gets doc_start (kernels/ops.h attention: position t attends to its own
 * document's tokens only) and the target at a document start becomes -1 too: no earlier
 * token of the window may predict it. */
#ifndef SHLM_DATA_LOADER_H
#define SHLM_DATA_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokens.h"

typedef struct data_loader {
    const token_file *tf;
    int seq_len;
    uint64_t n_windows;
    int shuffle;
    uint64_t seed;
    int rank, world;        /* data-parallel rank and size */
    int micro_batch;        /* rows per micro-batch on this rank */
    uint64_t cached_epoch;  /* epoch of perm below (UINT64_MAX = none) */
    uint64_t *perm;         /* window permutation of cached_epoch (shuffle only) */
    int doc_mask;           /* data.doc_mask (set after init, 0 by default): batches carry
                             * doc_start and the target at a document start is ignored */
    int32_t *window;        /* seq_len+1 tokens: the window being read */
    uint8_t *flags;         /* their TOKEN_* flags (io/tokens.h) */
    uint64_t *bits;         /* 2 x ceil(seq_len / 64) words: a window's targets' bits */
} data_loader;

/* Fails (returns -1, message in err) when the file holds fewer than seq_len+1 tokens. */
int data_loader_init(data_loader *dl, const token_file *tf, int seq_len, int shuffle,
                     uint64_t seed, int rank, int world, int micro_batch, char *err,
                     size_t errlen);
void data_loader_free(data_loader *dl);

/* The global sample micro-batch m's row b of this rank takes in the optimizer step whose
 * first global sample is step_start (above: step_start + (m·micro_batch + b)·world + rank). */
uint64_t data_loader_sample(const data_loader *dl, uint64_t step_start, int m, int b);

/* Window index of global sample g. */
uint64_t data_loader_window(data_loader *dl, uint64_t g);

/* The data position of a run resumed with windows of t_new tokens instead of t_old, over
 * a file of n_tokens tokens, unshuffled: position p (epoch p / nw_old, window p % nw_old)
 * has read every token before window (p % nw_old)'s first; the new position is that
 * epoch's first window of t_new tokens starting at or after that token. Pure; returns
 * 0, or -1 when either length leaves no window or the result overflows. */
int data_loader_reposition(uint64_t p, uint64_t n_tokens, int t_old, int t_new, uint64_t *out);

/* Fills inputs and targets (micro_batch × seq_len each) for micro-batch m of the
 * optimizer step whose first global sample is `step_start` (= s·G), after checking that
 * the token file is still the one opened (token_file_check). targets[t] is the next token,
 * or -1 where it is not trained (data_loader_target_trained). With doc_mask, doc_start
 * (micro_batch × seq_len) gets, for each position, the position in its row of its
 * document's first token (0 for a document begun before the window); without, doc_start
 * may be NULL and is not touched. Returns 0; or -1 with one line in err when the file
 * changed or cannot be read, the rows then all token 0 (doc_start all 0), so the caller
 * can finish the step's collectives and end the run with every rank. */
int data_loader_batch(data_loader *dl, uint64_t step_start, int m, int32_t *inputs,
                      int32_t *targets, int32_t *doc_start, char *err, size_t errlen);

/* One row from window `window` (not a global sample: no permutation, no rank): inputs
 * in, targets tg and, with doc_mask, document starts ds (seq_len each; ds may be NULL
 * without doc_mask), by the rules of data_loader_batch. No token_file_check. Returns 0,
 * or -1 with one line in err when the file cannot be read (the row then undefined). */
int data_loader_read_row(data_loader *dl, uint64_t window, int32_t *in, int32_t *tg,
                         int32_t *ds, char *err, size_t errlen);

/* The rule for one target: the flags of the token it predicts (TOKEN_* of io/tokens.h)
 * say whether the loss covers it: its loss-mask bit, and under doc_mask not a document's
 * first token. The same rule on 64 tokens' bits at once, for counting (the tests hold the
 * two to the same counts). */
static inline int data_loader_target_trained(uint8_t next_flags, int doc_mask) {
    return (next_flags & TOKEN_TRAINED) && !(doc_mask && (next_flags & TOKEN_DOC_START));
}
static inline uint64_t data_loader_targets_trained(uint64_t trained, uint64_t doc, int doc_mask) {
    return trained & ~(doc_mask ? doc : 0);
}

/* The trained targets of global samples [first, first + n) (all ranks' rows of all the
 * micro-batches of a step when n = G), by the rule above: what the step's loss sum is
 * divided by. Every rank computes the same number from the file alone (no collective).
 * Returns 0, or -1 with one line in err when the file cannot be read. */
int data_loader_count_targets(data_loader *dl, uint64_t first, uint64_t n, int64_t *out,
                              char *err, size_t errlen);

/* The trained targets of one window (by index), by the same rule. */
int data_loader_window_targets(data_loader *dl, uint64_t window, int64_t *out, char *err,
                               size_t errlen);

#endif
