/* The growable buffers tokenizers fill: ids and bytes. */
#ifndef SHLM_TOKEN_BUF_H
#define SHLM_TOKEN_BUF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A growable array of ids: functions append to it (n grows, cap and ids are reallocated
 * as needed). Start from {0}; free(ids) when done. Reusing one across calls avoids
 * allocations. */
typedef struct token_ids {
    int32_t *ids;
    size_t n, cap;
} token_ids;

/* A growable byte buffer, used like token_ids. */
typedef struct byte_buf {
    char *data;
    size_t n, cap;
} byte_buf;

/* Appends to the buffers; -1 when memory runs out. */
int token_ids_push(token_ids *t, int32_t id);
int token_ids_append(token_ids *t, const int32_t *ids, size_t n);
int byte_buf_append(byte_buf *b, const void *data, size_t n);
/* Room for n more bytes (and a NUL) without reallocation. */
int byte_buf_reserve(byte_buf *b, size_t n);

#ifdef __cplusplus
}
#endif

#endif
