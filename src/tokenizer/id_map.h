/* A map from byte strings to token ids: open addressing on token_cache_hash, the keys
 * copied into one arena. Used for vocabularies (raw bytes or the file's strings). */
#ifndef SHLM_ID_MAP_H
#define SHLM_ID_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct id_map id_map;

id_map *id_map_create(void); /* NULL: out of memory */
void id_map_free(id_map *m);
/* 0; 1 when the key is already there (its first id is kept); -1 when out of memory. */
int id_map_add(id_map *m, const void *key, size_t len, int32_t id);
/* The key's id, or -1. */
int32_t id_map_get(const id_map *m, const void *key, size_t len);

#endif
