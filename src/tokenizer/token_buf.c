/* The growable buffers (token_buf.h). */
#include "src/tokenizer/token_buf.h"

#include <stdlib.h>
#include <string.h>

int token_ids_push(token_ids *t, int32_t id) {
    if (t->n < t->cap) {
        t->ids[t->n++] = id;
        return 0;
    }
    return token_ids_append(t, &id, 1);
}

int token_ids_append(token_ids *t, const int32_t *ids, size_t n) {
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + n) cap *= 2;
        int32_t *g = realloc(t->ids, cap * sizeof *g);
        if (!g) return -1;
        t->ids = g;
        t->cap = cap;
    }
    if (n) memcpy(t->ids + t->n, ids, n * sizeof *ids);
    t->n += n;
    return 0;
}

int byte_buf_reserve(byte_buf *b, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *g = realloc(b->data, cap);
        if (!g) return -1;
        b->data = g;
        b->cap = cap;
    }
    return 0;
}

int byte_buf_append(byte_buf *b, const void *data, size_t n) {
    if (byte_buf_reserve(b, n) != 0) return -1;
    if (n) memcpy(b->data + b->n, data, n);
    b->n += n;
    b->data[b->n] = '\0'; /* always a C string too */
    return 0;
}
