/* Byte strings -> ids (id_map.h). */
#include "src/tokenizer/id_map.h"

#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/token_cache.h"

typedef struct slot {
    uint64_t hash; /* 0: empty */
    uint32_t off, len;
    int32_t id;
} slot;

struct id_map {
    slot *slots;
    size_t mask, used;
    unsigned char *arena;
    size_t arena_used, arena_cap;
};

id_map *id_map_create(void) {
    id_map *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->mask = 1023;
    m->slots = calloc(m->mask + 1, sizeof *m->slots);
    if (!m->slots) {
        free(m);
        return NULL;
    }
    return m;
}

void id_map_free(id_map *m) {
    if (!m) return;
    free(m->slots);
    free(m->arena);
    free(m);
}

int32_t id_map_get(const id_map *m, const void *key, size_t len) {
    uint64_t h = token_cache_hash(key, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const slot *s = &m->slots[i];
        if (!s->hash) return -1;
        if (s->hash == h && s->len == len && memcmp(m->arena + s->off, key, len) == 0)
            return s->id;
    }
}

static int grow(id_map *m) {
    size_t cap = (m->mask + 1) * 2;
    slot *g = calloc(cap, sizeof *g);
    if (!g) return -1;
    for (size_t i = 0; i <= m->mask; i++) {
        if (!m->slots[i].hash) continue;
        size_t j = m->slots[i].hash & (cap - 1);
        while (g[j].hash) j = (j + 1) & (cap - 1);
        g[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = g;
    m->mask = cap - 1;
    return 0;
}

int id_map_add(id_map *m, const void *key, size_t len, int32_t id) {
    if (id_map_get(m, key, len) >= 0) return 1;
    if (2 * (m->used + 1) > m->mask + 1 && grow(m) != 0) return -1;
    if (len > UINT32_MAX - m->arena_used) return -1;
    if (m->arena_used + len > m->arena_cap) {
        size_t cap = m->arena_cap ? 2 * m->arena_cap : 1 << 16;
        while (cap < m->arena_used + len) cap *= 2;
        unsigned char *g = realloc(m->arena, cap);
        if (!g) return -1;
        m->arena = g;
        m->arena_cap = cap;
    }
    if (len) memcpy(m->arena + m->arena_used, key, len);
    uint64_t h = token_cache_hash(key, len);
    size_t i = h & m->mask;
    while (m->slots[i].hash) i = (i + 1) & m->mask;
    m->slots[i] = (slot){h, (uint32_t)m->arena_used, (uint32_t)len, id};
    m->arena_used += len;
    m->used++;
    return 0;
}
