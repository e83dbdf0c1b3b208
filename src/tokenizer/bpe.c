/* Byte-level BPE (bpe.h): the alphabet, the vocabulary and merge maps, and the merge loop
 * with Hugging Face's order (a heap of candidate pairs keyed by (rank, position); a popped
 * pair is used only if both symbols are still what it was made from). */
#include "src/tokenizer/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/id_map.h"
#include "src/tokenizer/merge_heap.h"
#include "src/tokenizer/token_cache.h"

/* ---- the byte-level alphabet (GPT-2's bytes_to_unicode) ---- */

/* Bytes that are printable Latin-1 stand for themselves; the other 68 bytes (controls,
 * space, DEL, NBSP, soft hyphen...) take U+0100.. in byte order. */
static int printable_latin1(unsigned b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t bpe_byte_to_char(unsigned char b) {
    if (printable_latin1(b)) return b;
    uint32_t n = 0;
    for (unsigned i = 0; i < b; i++) n += !printable_latin1(i);
    return 256 + n;
}

int bpe_char_to_byte(uint32_t cp) {
    if (cp < 256) return printable_latin1(cp) ? (int)cp : -1;
    uint32_t n = 0;
    for (unsigned i = 0; i < 256; i++)
        if (!printable_latin1(i) && 256 + n++ == cp) return (int)i;
    return -1;
}

int bpe_bytelevel_to_bytes(const char *s, size_t n, unsigned char *out, size_t *out_n) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        if (c < 0x80) {
            cp = c;
            i += 1;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < n && ((unsigned char)s[i + 1] & 0xC0) == 0x80) {
            cp = (uint32_t)(c & 0x1F) << 6 | ((unsigned char)s[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1; /* the alphabet is below U+0800: two bytes at most */
        }
        int b = bpe_char_to_byte(cp);
        if (b < 0) return -1;
        out[o++] = (unsigned char)b;
    }
    *out_n = o;
    return 0;
}

int bpe_bytes_to_bytelevel(const unsigned char *bytes, size_t n, byte_buf *out) {
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = bpe_byte_to_char(bytes[i]);
        char u[2] = {(char)cp, 0};
        size_t len = 1;
        if (cp >= 0x80) {
            u[0] = (char)(0xC0 | cp >> 6);
            u[1] = (char)(0x80 | (cp & 0x3F));
            len = 2;
        }
        if (byte_buf_append(out, u, len) != 0) return -1;
    }
    return 0;
}

/* ---- maps ---- */

typedef struct merge_slot {
    uint64_t key; /* (left << 32 | right) + 1; 0: empty */
    uint32_t rank;
    int32_t merged;
} merge_slot;

struct bpe {
    int32_t byte_id[256]; /* the token of each single byte, -1: none */
    id_map *vocab;        /* raw bytes -> id */
    merge_slot *merges;
    size_t merge_mask, merge_used;
    uint32_t next_rank;
    int ignore_merges, fuse_unk;
    int32_t unk;
    token_cache *cache;
    /* scratch of one word: symbols as a linked list over byte positions, and the heap */
    int32_t *sym;
    int32_t *prev, *next;
    merge_heap heap; /* key: rank (ranks are below 2^24, exact in a float); tag: rank */
    size_t scratch_cap;
};

bpe *bpe_create(void) {
    bpe *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    memset(b->byte_id, 0xFF, sizeof b->byte_id);
    b->unk = -1;
    b->merge_mask = 1023;
    b->vocab = id_map_create();
    b->merges = calloc(b->merge_mask + 1, sizeof *b->merges);
    b->cache = token_cache_create(1 << 17);
    if (!b->vocab || !b->merges || !b->cache) {
        bpe_free(b);
        return NULL;
    }
    return b;
}

void bpe_free(bpe *b) {
    if (!b) return;
    id_map_free(b->vocab);
    free(b->merges);
    token_cache_free(b->cache);
    free(b->sym);
    free(b->prev);
    free(b->next);
    free(b->heap.items);
    free(b);
}

int32_t bpe_token_id(const bpe *b, const unsigned char *bytes, size_t len) {
    return id_map_get(b->vocab, bytes, len);
}

int bpe_add_token(bpe *b, int32_t id, const unsigned char *bytes, size_t len) {
    int rc = id_map_add(b->vocab, bytes, len, id);
    if (rc == 0 && len == 1) b->byte_id[bytes[0]] = id;
    return rc;
}

static inline uint64_t pair_key(int32_t left, int32_t right) {
    return ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
}

static inline size_t mix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return (size_t)k;
}

static const merge_slot *merge_find(const bpe *b, int32_t left, int32_t right) {
    uint64_t key = pair_key(left, right);
    for (size_t i = mix64(key) & b->merge_mask;; i = (i + 1) & b->merge_mask) {
        const merge_slot *s = &b->merges[i];
        if (s->key == key) return s;
        if (!s->key) return NULL;
    }
}

int bpe_add_merge(bpe *b, int32_t left, int32_t right, int32_t merged) {
    if (2 * (b->merge_used + 1) > b->merge_mask + 1) {
        size_t cap = (b->merge_mask + 1) * 2;
        merge_slot *g = calloc(cap, sizeof *g);
        if (!g) return -1;
        for (size_t i = 0; i <= b->merge_mask; i++) {
            if (!b->merges[i].key) continue;
            size_t j = mix64(b->merges[i].key) & (cap - 1);
            while (g[j].key) j = (j + 1) & (cap - 1);
            g[j] = b->merges[i];
        }
        free(b->merges);
        b->merges = g;
        b->merge_mask = cap - 1;
    }
    uint64_t key = pair_key(left, right);
    size_t i = mix64(key) & b->merge_mask;
    while (b->merges[i].key && b->merges[i].key != key) i = (i + 1) & b->merge_mask;
    if (!b->merges[i].key) b->merge_used++;
    b->merges[i] = (merge_slot){key, b->next_rank++, merged};
    return 0;
}

void bpe_set_options(bpe *b, int ignore_merges, int32_t unk, int fuse_unk) {
    b->ignore_merges = ignore_merges;
    b->unk = unk;
    b->fuse_unk = fuse_unk;
    token_cache_clear(b->cache); /* memoised words were encoded with the old options */
}

/* ---- the merge loop ---- */

static int scratch_reserve(bpe *b, size_t n) {
    if (n <= b->scratch_cap) return 0;
    size_t cap = b->scratch_cap ? b->scratch_cap : 64;
    while (cap < n) cap *= 2;
    int32_t *s = realloc(b->sym, cap * sizeof *s);
    if (s) b->sym = s;
    int32_t *p = realloc(b->prev, cap * sizeof *p);
    if (p) b->prev = p;
    int32_t *x = realloc(b->next, cap * sizeof *x);
    if (x) b->next = x;
    merge_cand *h = realloc(b->heap.items, 3 * cap * sizeof *h);
    if (h) b->heap.items = h;
    if (!s || !p || !x || !h) return -1;
    b->scratch_cap = cap;
    return 0;
}

/* the candidate merge of the symbol at pos with its successor, if any */
static void push_pair(bpe *b, int32_t pos) {
    if (pos < 0 || b->next[pos] < 0) return;
    const merge_slot *m = merge_find(b, b->sym[pos], b->sym[b->next[pos]]);
    if (m) merge_heap_push(&b->heap, (merge_cand){(float)m->rank, pos, b->next[pos], m->rank});
}

static int merge_word(bpe *b, const unsigned char *w, size_t len, token_ids *out) {
    if (scratch_reserve(b, len) != 0) return -1;
    /* one symbol per byte (a byte without a token: unk, or dropped) */
    int32_t n = 0;
    int last_unk = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t id = b->byte_id[w[i]];
        if (id < 0) {
            if (b->unk < 0 || (b->fuse_unk && last_unk)) continue;
            id = b->unk;
        }
        last_unk = id == b->unk && b->byte_id[w[i]] < 0;
        b->sym[n] = id;
        b->prev[n] = n - 1;
        b->next[n] = n + 1;
        n++;
    }
    if (n == 0) return 0;
    b->next[n - 1] = -1;
    b->heap.n = 0;
    for (int32_t i = 0; i + 1 < n; i++) push_pair(b, i);
    while (b->heap.n) {
        merge_cand top = merge_heap_pop(&b->heap);
        int32_t pos = top.pos;
        /* stale: the symbol was merged into its left neighbour, or its pair changed */
        if (b->sym[pos] < 0 || b->next[pos] < 0) continue;
        int32_t right = b->next[pos];
        const merge_slot *m = merge_find(b, b->sym[pos], b->sym[right]);
        if (!m || m->rank != top.tag) continue;
        b->sym[pos] = m->merged;
        b->sym[right] = -1;
        b->next[pos] = b->next[right];
        if (b->next[pos] >= 0) b->prev[b->next[pos]] = pos;
        push_pair(b, b->prev[pos]);
        push_pair(b, pos);
    }
    for (int32_t i = 0; i >= 0; i = b->next[i])
        if (token_ids_push(out, b->sym[i]) != 0) return -1;
    return 0;
}

int bpe_encode_word(bpe *b, const unsigned char *word, size_t len, token_ids *out) {
    if (b->ignore_merges) {
        int32_t id = bpe_token_id(b, word, len);
        if (id >= 0) return token_ids_push(out, id);
    }
    size_t n;
    const int32_t *ids = token_cache_get(b->cache, (const char *)word, len, &n);
    if (ids) return token_ids_append(out, ids, n);
    size_t before = out->n;
    if (merge_word(b, word, len, out) != 0) return -1;
    token_cache_put(b->cache, (const char *)word, len, out->ids + before, out->n - before);
    return 0;
}
