/* Document layouts for the tests of document-masked attention (ops.h attention_fwd's
 * doc_start): one sequence of T tokens cut into documents, as doc_start values (the
 * position of the first token of each token's document). Header-only, C and C++ (the
 * cpu op tests, the cuda op tests and the standalone Hopper checks share it). */
#ifndef SHLM_TESTS_DOC_LAYOUT_H
#define SHLM_TESTS_DOC_LAYOUT_H

#include <stdint.h>

enum doc_layout_kind {
    DOC_ONE,    /* one document: all zeros, the plain causal mask */
    DOC_RANDOM, /* lengths uniform in 1..maxlen */
    DOC_SHORT,  /* lengths 1 or 2: many single-token documents */
    DOC_LAST,   /* lengths uniform in 1..maxlen, and the last token a document of its own */
    DOC_FIXED   /* lengths maxlen (the last document cut at T) */
};

static inline const char *doc_layout_name(enum doc_layout_kind kind) {
    static const char *const names[] = {"one doc", "random docs", "docs of 1-2", "doc at T-1",
                                        "fixed docs"};
    return names[kind];
}

/* row[t] for t < T; rnd: the caller's generator of uniform 64-bit values */
static inline void doc_layout(int32_t *row, int T, enum doc_layout_kind kind, int maxlen,
                              uint64_t (*rnd)(void)) {
    int t = 0;
    while (t < T) {
        int len = kind == DOC_ONE     ? T
                  : kind == DOC_SHORT ? 1 + (int)(rnd() % 2)
                  : kind == DOC_FIXED ? maxlen
                                      : 1 + (int)(rnd() % (uint64_t)maxlen);
        if (kind == DOC_LAST && t + len >= T - 1) len = T - 1 - t > 0 ? T - 1 - t : 1;
        for (int i = t; i < t + len && i < T; i++) row[i] = t;
        t += len;
    }
}

#endif
