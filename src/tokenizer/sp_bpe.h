/* SentencePiece's BPE encoding (bpe_model.cc's Encode with the identity normaliser), in C,
 * for the models where it is the whole of what the library does: identity normaliser,
 * whitespace escaped to U+2581 and not collapsed, an optional dummy prefix, no user-defined
 * or unused pieces (src/tokenizer/tokenizer_sp.cc checks that from the model). The library is the
 * reference: tests/tokenizer_ref.sh compares the two through python sentencepiece.
 *
 *   normalise   a dummy "▁" first (when asked, and the text is not empty), each ' ' as "▁",
 *               each byte of malformed UTF-8 as U+FFFD, every other character as it is
 *   split       one symbol per character
 *   merge       repeatedly the adjacent pair whose concatenation is a piece with the
 *               highest score (the leftmost among equals)
 *   ids         each symbol's piece; a symbol that is no piece (or the unknown piece) is
 *               its bytes' <0xXX> pieces with byte fallback, else unk (a run of them one
 *               unk)
 */
#ifndef SHLM_SP_BPE_H
#define SHLM_SP_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "src/tokenizer/token_buf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_bpe sp_bpe;

/* A model of n pieces; unk is the unknown piece's id. NULL: out of memory. */
sp_bpe *sp_bpe_create(int32_t n, int32_t unk, int byte_fallback);
void sp_bpe_free(sp_bpe *m);
/* Piece `id`: its string and score; `mergeable` for normal pieces (merges may produce
 * them), 0 for control, unknown and byte pieces. 0, or -1 when out of memory. */
int sp_bpe_add_piece(sp_bpe *m, int32_t id, const char *piece, size_t len, float score,
                     int mergeable);
/* Appends the ids of text[0, len) (the library's Encode of that text). 0, or -1 when out
 * of memory. */
int sp_bpe_encode(sp_bpe *m, const char *text, size_t len, int dummy_prefix, token_ids *out);

#ifdef __cplusplus
}
#endif

#endif
