/* What a tokenizer implementation provides to the interface (src/tokenizer/tokenizer.c): a
 * table of functions and what its file says about special tokens; the tokenizer object
 * they fill; the helpers they share (tokenizer_impl.c). Below the interface: it does not
 * include tokenizer.h. */
#ifndef SHLM_TOKENIZER_IMPL_H
#define SHLM_TOKENIZER_IMPL_H

#include <stdarg.h>

#include "src/tokenizer/token_buf.h"
#include "src/tokenizer/tokenizer_limits.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tokenizer tokenizer; /* tokenizer.h's, the same typedef */

typedef struct tokenizer_ops {
    const char *kind; /* tokenizer_kind() */
    /* appends the ids of text (no bos/eos); on a failure that one byte of text caused
     * (malformed UTF-8, a piece past TOKENIZER_MAX_PIECE, the pattern failing on the piece
     * starting there) *at is set to its offset, and the message says what, not where */
    int (*encode)(void *impl, const char *text, size_t len, token_ids *out, size_t *at,
                  char *err, size_t errlen);
    /* appends the text of ids (each < vocab_size, checked by the caller); special tokens
     * left out when skip_special */
    int (*decode)(void *impl, const int32_t *ids, size_t n, int skip_special, byte_buf *out,
                  char *err, size_t errlen);
    int32_t (*token_id)(const void *impl, const char *s);      /* -1: none */
    const char *(*token_string)(const void *impl, int32_t id); /* NULL: none */
    int (*is_special)(const void *impl, int32_t id);
    const char *(*encoder)(const void *impl); /* tokenizer_encoder() */
    void (*free)(void *impl);
} tokenizer_ops;

/* What the tokenizer file alone says, before the model directory's JSON files: bos/eos/pad
 * (-1: none) and whether an encoded text gets bos/eos. */
typedef struct tokenizer_file_specials {
    int32_t bos, eos, pad;
    int add_bos, add_eos;
} tokenizer_file_specials;

struct tokenizer {
    const tokenizer_ops *ops;
    void *impl;
    char path[1024];     /* the tokenizer file, or "bytes" */
    char dir[1024];      /* the model directory read for special tokens; "" for bytes */
    uint32_t vocab_size; /* largest id + 1 */
    tokenizer_file_specials file;
    /* resolved (src/tokenizer/tokenizer_specials.c) */
    int32_t bos, pad;
    int32_t *eos_ids;
    int n_eos;
    int add_bos, add_eos;
    char *chat_template;
    char chat_template_path[1100]; /* the file it came from ("" when none) */
    size_t error_offset;           /* tokenizer_error_offset() */
};

/* Reads a whole file into a malloc'd, NUL-terminated buffer (*len bytes before the NUL);
 * NULL with "PATH: problem" in err. */
char *tokenizer_read_file(const char *path, size_t *len, char *err, size_t errlen);

/* io_set_err into err (shared by the implementations): one line, whatever it quotes. */
void tokenizer_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif

#endif
