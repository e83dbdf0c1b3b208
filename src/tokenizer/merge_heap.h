/* The agenda of the two BPE encoders (src/tokenizer/bpe.c, src/tokenizer/sp_bpe.c): a binary min-heap of
 * candidate merges ordered by key, then by the left symbol's position, so that among equal
 * keys the leftmost pair merges first, as in both reference libraries. The items array is
 * the caller's, sized for every push of one word. */
#ifndef SHLM_MERGE_HEAP_H
#define SHLM_MERGE_HEAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct merge_cand {
    float key;     /* lower first: a merge rank, or minus a piece score */
    int32_t pos;   /* the left symbol */
    int32_t right; /* the right symbol (the caller's to use) */
    uint32_t tag;  /* what the caller checks the pair against when it is popped */
} merge_cand;

typedef struct merge_heap {
    merge_cand *items;
    size_t n;
} merge_heap;

static inline int merge_cand_before(const merge_cand *a, const merge_cand *b) {
    return a->key < b->key || (a->key == b->key && a->pos < b->pos);
}

static inline void merge_heap_push(merge_heap *h, merge_cand c) {
    size_t i = h->n++;
    while (i > 0 && merge_cand_before(&c, &h->items[(i - 1) / 2])) {
        h->items[i] = h->items[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->items[i] = c;
}

static inline merge_cand merge_heap_pop(merge_heap *h) {
    merge_cand top = h->items[0], last = h->items[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && merge_cand_before(&h->items[c + 1], &h->items[c])) c++;
        if (!merge_cand_before(&h->items[c], &last)) break;
        h->items[i] = h->items[c];
        i = c;
    }
    if (h->n) h->items[i] = last;
    return top;
}

#endif
