/* Byte-level BPE, the model of GPT-2 / Llama-3 / SmolLM2 tokenizers as Hugging Face
 * tokenizers runs it: a word (one pre-token) starts as one symbol per byte, then the
 * adjacent pair of lowest merge rank is merged (the leftmost among equals) until no pair
 * has a merge. Tokens are held as raw bytes: the byte-level alphabet (GPT-2's printable
 * stand-ins for bytes, "Ġ" for a space) is undone once at load (bpe_bytelevel_to_bytes).
 *
 * Hot-path costs: a merge-rank hash map, a word -> ids memo (src/tokenizer/token_cache.h), scratch
 * buffers grown once; nothing is allocated per word after warm-up. */
#ifndef SHLM_BPE_H
#define SHLM_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "src/tokenizer/token_buf.h"

typedef struct bpe bpe;

bpe *bpe_create(void); /* NULL: out of memory */
void bpe_free(bpe *b);

/* The byte-level alphabet: the code point standing for byte b, and the byte a code point
 * stands for (-1 when it stands for none). */
uint32_t bpe_byte_to_char(unsigned char b);
int bpe_char_to_byte(uint32_t cp);
/* Undoes the alphabet on a UTF-8 string s[0, n): writes at most n bytes to out and sets
 * *out_n. Returns 0, or -1 when s holds a character outside the alphabet (or bad UTF-8). */
int bpe_bytelevel_to_bytes(const char *s, size_t n, unsigned char *out, size_t *out_n);
/* Appends the UTF-8 of the alphabet characters standing for bytes[0, n) to out. */
int bpe_bytes_to_bytelevel(const unsigned char *bytes, size_t n, byte_buf *out);

/* A vocabulary entry the merges can produce: its raw bytes. Returns 0, -1 when out of
 * memory, 1 when the bytes already have an id (the first one is kept). */
int bpe_add_token(bpe *b, int32_t id, const unsigned char *bytes, size_t len);
/* The id of raw bytes, or -1. */
int32_t bpe_token_id(const bpe *b, const unsigned char *bytes, size_t len);
/* The next merge, ranks in call order: left + right -> merged (ids). A pair given again
 * takes the later rank, as Hugging Face's map does. 0, or -1 when out of memory. */
int bpe_add_merge(bpe *b, int32_t left, int32_t right, int32_t merged);
/* ignore_merges: a word that is a vocabulary entry is that token, merges unused (Llama-3).
 * unk >= 0: a byte with no token becomes unk (consecutive ones fused into one when
 * fuse_unk); unk < 0: such a byte is dropped. Both as Hugging Face's BPE. */
void bpe_set_options(bpe *b, int ignore_merges, int32_t unk, int fuse_unk);

/* Appends the ids of one word (raw bytes). 0, or -1 when out of memory. */
int bpe_encode_word(bpe *b, const unsigned char *word, size_t len, token_ids *out);

#endif
