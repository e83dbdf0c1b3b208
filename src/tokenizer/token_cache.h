/* A bounded memo of word -> token ids, shared by the tokenizers: encoding a word is a pure
 * function of its bytes, and natural text repeats a few thousand words. Open addressing on
 * a 64-bit hash, keys and ids in two arenas; when either fills, everything is dropped and
 * the memo starts again (no per-entry allocation, no eviction bookkeeping). */
#ifndef SHLM_TOKEN_CACHE_H
#define SHLM_TOKEN_CACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { TOKEN_CACHE_MAX_KEY = 256 }; /* longer words are not memoised */

typedef struct token_cache token_cache;

/* A memo of up to `entries` words (rounded up to a power of two); NULL when out of memory. */
token_cache *token_cache_create(size_t entries);
void token_cache_free(token_cache *c);

/* The ids of key[0, len), *n of them, or NULL when not memoised. */
const int32_t *token_cache_get(const token_cache *c, const char *key, size_t len, size_t *n);
/* Memoises ids[0, n) for the key (ignored when len > TOKEN_CACHE_MAX_KEY). */
void token_cache_put(token_cache *c, const char *key, size_t len, const int32_t *ids, size_t n);

/* Forgets every entry. */
void token_cache_clear(token_cache *c);

/* The hash used for keys (64 bits, any length). */
uint64_t token_cache_hash(const void *data, size_t len);

#ifdef __cplusplus
}
#endif

#endif
