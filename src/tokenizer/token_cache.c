/* The word -> ids memo (token_cache.h). */
#include "src/tokenizer/token_cache.h"

#include <stdlib.h>
#include <string.h>

typedef struct entry {
    uint64_t hash;     /* 0: empty slot */
    uint32_t key_off;  /* into keys */
    uint32_t ids_off;  /* into ids */
    uint16_t key_len;
    uint16_t n_ids;
} entry;

struct token_cache {
    entry *slots;
    size_t mask;           /* slots - 1 */
    size_t used, max_used; /* entries; the table is at most half full */
    char *keys;
    size_t keys_used, keys_cap;
    int32_t *ids;
    size_t ids_used, ids_cap;
};

uint64_t token_cache_hash(const void *data, size_t len) {
    /* 8 bytes at a time, each word multiplied in and folded (a small, fast mix; the table
     * needs spread, not cryptographic strength) */
    const unsigned char *p = data;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (len * 0xFF51AFD7ED558CCDull);
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
        h ^= h >> 29;
        p += 8;
        len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, len);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 32;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    return h | 1; /* never 0: 0 marks an empty slot */
}

token_cache *token_cache_create(size_t entries) {
    token_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    size_t slots = 16;
    while (slots < 2 * entries) slots *= 2;
    c->mask = slots - 1;
    c->max_used = slots / 2;
    c->keys_cap = c->max_used * 16;
    c->ids_cap = c->max_used * 4;
    c->slots = calloc(slots, sizeof *c->slots);
    c->keys = malloc(c->keys_cap);
    c->ids = malloc(c->ids_cap * sizeof *c->ids);
    if (!c->slots || !c->keys || !c->ids) {
        token_cache_free(c);
        return NULL;
    }
    return c;
}

void token_cache_free(token_cache *c) {
    if (!c) return;
    free(c->slots);
    free(c->keys);
    free(c->ids);
    free(c);
}

const int32_t *token_cache_get(const token_cache *c, const char *key, size_t len, size_t *n) {
    if (len > TOKEN_CACHE_MAX_KEY) return NULL;
    uint64_t h = token_cache_hash(key, len);
    for (size_t i = h & c->mask;; i = (i + 1) & c->mask) {
        const entry *e = &c->slots[i];
        if (!e->hash) return NULL;
        if (e->hash == h && e->key_len == len && memcmp(c->keys + e->key_off, key, len) == 0) {
            *n = e->n_ids;
            return c->ids + e->ids_off;
        }
    }
}

void token_cache_clear(token_cache *c) {
    memset(c->slots, 0, (c->mask + 1) * sizeof *c->slots);
    c->used = c->keys_used = c->ids_used = 0;
}

void token_cache_put(token_cache *c, const char *key, size_t len, const int32_t *ids, size_t n) {
    if (len > TOKEN_CACHE_MAX_KEY || n > 0xFFFF || n > c->ids_cap) return;
    if (c->used + 1 > c->max_used || c->keys_used + len > c->keys_cap ||
        c->ids_used + n > c->ids_cap)
        token_cache_clear(c);
    uint64_t h = token_cache_hash(key, len);
    size_t i = h & c->mask;
    while (c->slots[i].hash) i = (i + 1) & c->mask;
    c->slots[i] = (entry){.hash = h,
                          .key_off = (uint32_t)c->keys_used,
                          .ids_off = (uint32_t)c->ids_used,
                          .key_len = (uint16_t)len,
                          .n_ids = (uint16_t)n};
    memcpy(c->keys + c->keys_used, key, len);
    if (n) memcpy(c->ids + c->ids_used, ids, n * sizeof *ids);
    c->keys_used += len;
    c->ids_used += n;
    c->used++;
}
