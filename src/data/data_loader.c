/* The data loader: windows of seq_len+1 tokens, a per-epoch permutation drawn from
 * (seed, epoch), the global-sample-to-rank mapping, and the targets and document starts of
 * packed documents, as documented in data_loader.h. */
#include "src/data/data_loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/rng.h"

/* Domain separator, so the data order never shares a stream with the model init or the
 * sampler even when they are keyed by the same seed. */
#define DATA_RNG_DOMAIN 0x646174616f726465ull /* "dataorde" */

/* The key of epoch e's permutation. Everything below is part of the on-disk contract
 * (a checkpoint stores only the global sample index), so changing it changes which
 * windows a resumed run sees. */
static uint64_t perm_key(uint64_t seed, uint64_t epoch) {
    return rng_hash64(rng_hash64(seed ^ DATA_RNG_DOMAIN) + epoch);
}

/* Fisher–Yates from the top: position i swaps with a uniform j in [0, i]. Draw i is
 * rng_hash64(key ^ i), mapped to [0, i] by a 64×64→128-bit multiply (bias < n/2^64). */
static void build_perm(uint64_t *perm, uint64_t n, uint64_t seed, uint64_t epoch) {
    uint64_t key = perm_key(seed, epoch);
    for (uint64_t i = 0; i < n; i++) perm[i] = i;
    for (uint64_t i = n; i-- > 1;) {
        uint64_t x = rng_hash64(key ^ i);
        uint64_t j = (uint64_t)(((unsigned __int128)x * (i + 1)) >> 64);
        uint64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

int data_loader_init(data_loader *dl, const token_file *tf, int seq_len, int shuffle,
                     uint64_t seed, int rank, int world, int micro_batch, char *err,
                     size_t errlen) {
    memset(dl, 0, sizeof *dl);
    dl->cached_epoch = UINT64_MAX;
    if (seq_len < 1 || world < 1 || rank < 0 || rank >= world || micro_batch < 1) {
        snprintf(err, errlen,
                 "data loader: bad arguments seq_len %d, rank %d of %d, micro_batch %d",
                 seq_len, rank, world, micro_batch);
        return -1;
    }
    if (tf->count < (uint64_t)seq_len + 1) {
        /* the file's own role (data.train, data.val) is in its path's message */
        snprintf(err, errlen,
                 "%s: holds %llu token%s, fewer than the %llu of one window (seq_len %d "
                 "inputs and the token after them, the last one's target)",
                 tf->path, (unsigned long long)tf->count, tf->count == 1 ? "" : "s",
                 (unsigned long long)seq_len + 1, seq_len);
        return -1;
    }
    dl->tf = tf;
    dl->seq_len = seq_len;
    /* windows overlap by one token (the last target of w is the first input of w+1),
     * so the final token can only ever be a target */
    dl->n_windows = (tf->count - 1) / (uint64_t)seq_len;
    dl->shuffle = shuffle != 0;
    dl->seed = seed;
    dl->rank = rank;
    dl->world = world;
    dl->micro_batch = micro_batch;
    dl->window = malloc(((size_t)seq_len + 1) * sizeof *dl->window);
    dl->flags = malloc((size_t)seq_len + 1);
    dl->bits = malloc(2 * (((size_t)seq_len + 63) / 64) * sizeof *dl->bits);
    if (!dl->window || !dl->flags || !dl->bits) {
        snprintf(err, errlen, "%s: out of memory for a window of %d tokens", tf->path,
                 seq_len + 1);
        data_loader_free(dl);
        return -1;
    }
    if (dl->shuffle) {
        dl->perm = malloc(dl->n_windows * sizeof *dl->perm);
        if (!dl->perm) {
            snprintf(err, errlen, "%s: out of memory for a permutation of %llu windows",
                     tf->path, (unsigned long long)dl->n_windows);
            data_loader_free(dl);
            return -1;
        }
    }
    return 0;
}

void data_loader_free(data_loader *dl) {
    free(dl->perm);
    free(dl->window);
    free(dl->flags);
    free(dl->bits);
    dl->bits = NULL;
    dl->perm = NULL;
    dl->window = NULL;
    dl->flags = NULL;
    dl->cached_epoch = UINT64_MAX;
}

uint64_t data_loader_window(data_loader *dl, uint64_t g) {
    uint64_t epoch = g / dl->n_windows, i = g % dl->n_windows;
    if (!dl->shuffle) return i;
    /* one cached epoch is enough: a rank visits its samples in increasing order, so
     * each epoch's permutation is built once */
    if (dl->cached_epoch != epoch) {
        build_perm(dl->perm, dl->n_windows, dl->seed, epoch);
        dl->cached_epoch = epoch;
    }
    return dl->perm[i];
}

uint64_t data_loader_sample(const data_loader *dl, uint64_t step_start, int m, int b) {
    return step_start + ((uint64_t)m * dl->micro_batch + b) * (uint64_t)dl->world + dl->rank;
}

int data_loader_read_row(data_loader *dl, uint64_t window, int32_t *in, int32_t *tg,
                         int32_t *ds, char *err, size_t errlen) {
    const int T = dl->seq_len;
    const uint64_t w = window * (uint64_t)T;
    if (token_file_read(dl->tf, w, (size_t)T + 1, dl->window, err, errlen) != 0 ||
        token_file_read_flags(dl->tf, w, (size_t)T + 1, dl->flags, err, errlen) != 0)
        return -1;
    memcpy(in, dl->window, (size_t)T * sizeof *in);
    for (int t = 0; t < T; t++)
        tg[t] = data_loader_target_trained(dl->flags[t + 1], dl->doc_mask) ? dl->window[t + 1] : -1;
    if (dl->doc_mask) {
        int32_t start = 0;
        for (int t = 0; t < T; t++) {
            if (dl->flags[t] & TOKEN_DOC_START) start = t;
            ds[t] = start;
        }
    }
    return 0;
}

int data_loader_batch(data_loader *dl, uint64_t step_start, int m, int32_t *inputs,
                      int32_t *targets, int32_t *doc_start, char *err, size_t errlen) {
    const int T = dl->seq_len;
    const size_t n = (size_t)dl->micro_batch * T;
    if (token_file_check(dl->tf, err, errlen) != 0) goto fail;
    for (int b = 0; b < dl->micro_batch; b++) {
        const size_t row = (size_t)b * T;
        const uint64_t w = data_loader_window(dl, data_loader_sample(dl, step_start, m, b));
        if (data_loader_read_row(dl, w, inputs + row, targets + row,
                                 dl->doc_mask ? doc_start + row : NULL, err, errlen) != 0)
            goto fail;
    }
    return 0;
fail:
    memset(inputs, 0, n * sizeof *inputs);
    memset(targets, 0, n * sizeof *targets);
    if (dl->doc_mask) memset(doc_start, 0, n * sizeof *doc_start);
    return -1;
}

/* Every token trained and no document start but token 0's, which is never a target:
 * every target of every window counts. */
static int all_targets_trained(const data_loader *dl) {
    const token_file *tf = dl->tf;
    return tf->trained == tf->count && (!dl->doc_mask || tf->documents <= 1) && !tf->flags;
}

int data_loader_window_targets(data_loader *dl, uint64_t window, int64_t *out, char *err,
                               size_t errlen) {
    const int T = dl->seq_len;
    if (all_targets_trained(dl)) {
        *out = T;
        return 0;
    }
    const size_t words = ((size_t)T + 63) / 64;
    uint64_t *trained = dl->bits, *doc = dl->bits + words;
    /* the targets of window w are its tokens 1..T */
    if (token_file_read_bits(dl->tf, window * (uint64_t)T + 1, (size_t)T, trained, doc, err,
                             errlen) != 0)
        return -1;
    int64_t total = 0;
    for (size_t k = 0; k < words; k++)
        total += __builtin_popcountll(data_loader_targets_trained(trained[k], doc[k], dl->doc_mask));
    *out = total;
    return 0;
}

int data_loader_count_targets(data_loader *dl, uint64_t first, uint64_t n, int64_t *out,
                              char *err, size_t errlen) {
    if (all_targets_trained(dl)) {
        *out = (int64_t)(n * (uint64_t)dl->seq_len);
        return 0;
    }
    int64_t total = 0;
    for (uint64_t g = first; g < first + n; g++) {
        int64_t k;
        if (data_loader_window_targets(dl, data_loader_window(dl, g), &k, err, errlen) != 0)
            return -1;
        total += k;
    }
    *out = total;
    return 0;
}

int data_loader_reposition(uint64_t p, uint64_t n_tokens, int t_old, int t_new, uint64_t *out) {
    if (t_old < 1 || t_new < 1 || n_tokens < 2) return -1;
    const uint64_t nw_old = (n_tokens - 1) / (uint64_t)t_old;
    const uint64_t nw_new = (n_tokens - 1) / (uint64_t)t_new;
    if (nw_old == 0 || nw_new == 0) return -1;
    const uint64_t epoch = p / nw_old, first_unread = p % nw_old * (uint64_t)t_old;
    const unsigned __int128 pos = (unsigned __int128)epoch * nw_new +
                                  (first_unread + (uint64_t)t_new - 1) / (uint64_t)t_new;
    if (pos > UINT64_MAX) return -1;
    *out = (uint64_t)pos;
    return 0;
}
