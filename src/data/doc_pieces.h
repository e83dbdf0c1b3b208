/* A document as the formats of `data prepare` and the chat templates build it: pieces of
 * text and special tokens, each marked trained (the loss covers it) or not, and their
 * tokenization, which gives the ids of the whole text and the loss mask of the pieces. */
#ifndef SHLM_DOC_PIECES_H
#define SHLM_DOC_PIECES_H

#include <stddef.h>
#include <stdint.h>

#include "src/tokenizer/tokenizer.h"

/* text[off, off + len) of the document; token >= 0: that special token (its string, or
 * nothing, in the text), -1: text to encode. */
typedef struct doc_piece {
    int32_t token;
    size_t off, len;
    int trained;
} doc_piece;

typedef struct doc_pieces {
    byte_buf text;  /* the whole document's text, special tokens as their strings */
    doc_piece *p;
    size_t n, cap;
} doc_pieces;

/* Append a piece; -1 when memory runs out. doc_pieces_token's text is the token's string
 * (tokenizer_token_string; NULL adds nothing to the text). */
int doc_pieces_text(doc_pieces *d, const char *s, size_t len, int trained);
int doc_pieces_token(doc_pieces *d, int32_t id, const char *text, int trained);
/* Empties d for the next document (keeps its memory). */
void doc_pieces_clear(doc_pieces *d);
void doc_pieces_free(doc_pieces *d);

/* Appends the document's ids to ids and a TOKEN_TRAINED flag or 0 per id to flags (one
 * byte per id). Each run of text pieces between two special tokens is encoded as one
 * text, so the ids are those of the whole run (the ids tokenizer_encode gives the text
 * between the special tokens); a cut between two pieces of a run is placed after the ids
 * that encoding the run up to the cut shares with the whole run's, so a token that spans
 * the cut belongs to the piece it ends in. Returns 0, or -1 with one line in err. */
int doc_pieces_encode(tokenizer *tok, const doc_pieces *d, token_ids *ids, byte_buf *flags,
                      char *err, size_t errlen);

#endif
