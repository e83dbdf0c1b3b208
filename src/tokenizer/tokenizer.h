/* Tokenizers: text <-> token ids behind one interface, with three implementations picked
 * by what is opened: the byte tokenizer (`bytes`: id = byte value, vocab 256), SentencePiece
 * model files (`tokenizer.model`, through libsentencepiece: src/tokenizer/tokenizer_sp.cc) and Hugging
 * Face `tokenizer.json` byte-level BPE (src/tokenizer/tokenizer_hf.c over src/tokenizer/bpe.c).
 *
 * Every function that can fail returns 0, or -1 with one line in err naming the file and
 * the problem; nothing here prints or exits. A tokenizer is not thread-safe (encode uses
 * caches and scratch buffers it owns): one per thread.
 *
 * Special tokens (bos, eos, pad, add_bos, add_eos) are resolved once at open, as
 * transformers reads them; the precedence is written in one place, src/tokenizer/tokenizer_specials.c.
 */
#ifndef SHLM_TOKENIZER_H
#define SHLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "src/tokenizer/token_buf.h"
#include "src/tokenizer/tokenizer_limits.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tokenizer tokenizer;

/* Opens SPEC:
 *   "bytes"                  the byte tokenizer
 *   a directory              its tokenizer.model (SentencePiece) if present, else its
 *                            tokenizer.json (Hugging Face); its tokenizer_config.json,
 *                            special_tokens_map.json, generation_config.json, config.json
 *                            and chat_template.jinja give the special tokens and template
 *   a file                   tokenizer.json-style JSON (starts with '{') or a SentencePiece
 *                            model; the file's directory is read as the model directory */
int tokenizer_open(tokenizer **out, const char *spec, char *err, size_t errlen);
void tokenizer_free(tokenizer *t);

/* 1 when DIR holds a tokenizer that tokenizer_open(DIR) would pick up. */
int tokenizer_dir_has_one(const char *dir);

/* "bytes", "sentencepiece" or "hf-bpe"; and the file read ("bytes" for the byte one). */
const char *tokenizer_kind(const tokenizer *t);
const char *tokenizer_path(const tokenizer *t);
/* How encode works, in a few words (which of an implementation's exact paths it takes). */
const char *tokenizer_encoder(const tokenizer *t);

enum tokenizer_flags {
    TOKENIZER_ADD_BOS = 1 << 0,      /* encode: prepend bos */
    TOKENIZER_ADD_EOS = 1 << 1,      /* encode: append eos */
    TOKENIZER_SKIP_SPECIAL = 1 << 2, /* decode: leave special tokens out of the text */
};


/* Appends the ids of text[0, len) to out, without bos or eos. Hugging Face tokenizers
 * refuse text that is not valid UTF-8 (the reference library takes only Unicode strings);
 * SentencePiece and bytes take any bytes. A piece longer than TOKENIZER_MAX_PIECE, and an
 * error of a pre-tokenizer's pattern (PCRE2's match limit: the reference library fails
 * there too), is an error. */
int tokenizer_encode(tokenizer *t, const char *text, size_t len, token_ids *out, char *err,
                     size_t errlen);
/* After tokenizer_encode(_with) failed: the offset in its text of the byte the failure is
 * about (the first byte of malformed UTF-8, the start of the piece that is too long or
 * that the pattern failed on), or (size_t)-1 when there is none (out of memory, a library
 * error). Its message says what, not where: a caller that knows where the text came from
 * adds FILE:LINE and the byte (io/errmsg.h, IO_AT_BYTE). */
size_t tokenizer_error_offset(const tokenizer *t);
/* Same, adding bos and/or eos as flags say (TOKENIZER_ADD_BOS/EOS). */
int tokenizer_encode_with(tokenizer *t, const char *text, size_t len, int flags,
                          token_ids *out, char *err, size_t errlen);
/* The flags that add bos/eos as the model's configuration says (add_bos, add_eos). */
int tokenizer_default_flags(const tokenizer *t);

/* A document of a token file: bos as the model's configuration says, then the text, then
 * eos (when the tokenizer has one). */
int tokenizer_document_flags(const tokenizer *t);

/* Appends the text of ids to out. Special tokens appear as their strings unless flags
 * has TOKENIZER_SKIP_SPECIAL. An id outside the vocabulary is an error. */
int tokenizer_decode(tokenizer *t, const int32_t *ids, size_t n, int flags, byte_buf *out,
                     char *err, size_t errlen);

/* Incremental decode for printing generated tokens one at a time: the concatenation of
 * everything push and flush append equals tokenizer_decode of all the ids pushed. Text
 * is held back while it ends inside an incomplete UTF-8 sequence or with U+FFFD (a byte
 * piece waiting for the rest of its character), and released when the next token
 * completes it or at flush. Cost per token: a decode of the ids since the last release. */
typedef struct tokenizer_stream {
    token_ids ids;       /* every id pushed */
    size_t prefix, read; /* ids[prefix, read) decode to the text already released */
    byte_buf a, b;       /* scratch */
    int flags;
} tokenizer_stream;
void tokenizer_stream_init(tokenizer_stream *s, int flags);
int tokenizer_stream_push(tokenizer *t, tokenizer_stream *s, int32_t id, byte_buf *out,
                          char *err, size_t errlen);
int tokenizer_stream_flush(tokenizer *t, tokenizer_stream *s, byte_buf *out, char *err,
                           size_t errlen);
void tokenizer_stream_free(tokenizer_stream *s);

/* Special tokens. tokenizer_token_id: the id of a token given by its string as the file
 * writes it (an added or special token's content, a SentencePiece piece, a byte-level
 * vocabulary entry such as "Ġthe"), or -1. tokenizer_token_string: that string for an
 * id (NULL when the id has none; the byte tokenizer has none). */
int32_t tokenizer_token_id(const tokenizer *t, const char *s);
const char *tokenizer_token_string(const tokenizer *t, int32_t id);
/* 1 for special tokens: Hugging Face added tokens marked special, SentencePiece control
 * and unknown pieces. */
int tokenizer_is_special(const tokenizer *t, int32_t id);

/* bos, the eos and pad ids, -1 when there is none. */
int32_t tokenizer_bos(const tokenizer *t);
int32_t tokenizer_eos(const tokenizer *t);
int32_t tokenizer_pad(const tokenizer *t);
/* Every end-of-sequence id (generation_config.json may list several): the first is
 * tokenizer_eos(). *n = 0 when there is none. */
const int32_t *tokenizer_eos_ids(const tokenizer *t, int *n);
/* Whether the model's configuration adds bos / eos to an encoded text. */
int tokenizer_add_bos(const tokenizer *t);
int tokenizer_add_eos(const tokenizer *t);
/* The largest id + 1, counting added tokens. */
uint32_t tokenizer_vocab_size(const tokenizer *t);
/* The raw chat template (chat_template.jinja, else tokenizer_config.json's
 * "chat_template"), NULL when the model directory has none. */
const char *tokenizer_chat_template(const tokenizer *t);
/* The file that template came from ("" when there is none). */
const char *tokenizer_chat_template_path(const tokenizer *t);

#ifdef __cplusplus
}
#endif

#endif
