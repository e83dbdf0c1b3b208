/* Token data files: a fixed 32-byte little-endian header followed by the tokens.
 *
 *   offset size field
 *   0      8    magic "SHLMTOK\0"
 *   8      4    version (1)
 *   12     4    token width in bytes (2 or 4)
 *   16     8    token count
 *   24     4    vocab size (every token id is < this)
 *   28     4    reserved (0)
 *   32     ...  tokens, uint16 or uint32 little-endian
 */
#ifndef SHLM_TOKENS_H
#define SHLM_TOKENS_H

#include <stddef.h>
#include <stdint.h>

enum { TOKENS_HEADER_BYTES = 32, TOKENS_VERSION = 1 };
#define TOKENS_MAGIC "SHLMTOK"

typedef struct token_file {
    char path[1024];
    int width;          /* 2 or 4 */
    uint64_t count;     /* tokens in the file */
    uint32_t vocab_size;
    /* the body, mapped read-only from the file (token_file_open): pages are read on
     * demand, so a corpus larger than memory costs no more than the windows in use */
    const unsigned char *body;
    void *map;           /* the whole mapping, for munmap */
    size_t map_len;
    int32_t *tokens;    /* tokens held in memory instead (tests build these by hand) */
} token_file;

/* Token i of the file (i < count). */
static inline int32_t token_at(const token_file *tf, uint64_t i) {
    if (tf->tokens) return tf->tokens[i];
    const unsigned char *p = tf->body + i * (uint64_t)tf->width;
    return tf->width == 2 ? (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8)
                          : (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                                      (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* Opens (maps) and fully validates a token file: magic, version, width, that the body
 * holds exactly `count` tokens, and that every id is < vocab_size. On error writes one line
 * naming the file and the problem into err and returns -1. */
int token_file_open(token_file *tf, const char *path, char *err, size_t errlen);
void token_file_close(token_file *tf);

/* Writes n tokens (each < vocab_size) with the given width, under a temporary name renamed
 * onto path (io/safe_file.h: a link at path is refused). Returns 0, or -1 with err. */
int token_file_write(const char *path, const int32_t *tokens, uint64_t n, int width,
                     uint32_t vocab_size, char *err, size_t errlen);

/* The byte tokenizer: token = byte value, vocab 256. */
enum { BYTE_VOCAB_SIZE = 256 };

#endif
