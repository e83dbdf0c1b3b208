/* Documents as pieces of text and special tokens, and their tokenization with the loss
 * mask of each piece (doc_pieces.h). */
#include "src/data/doc_pieces.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokens.h"

static int push(doc_pieces *d, int32_t token, const char *s, size_t len, int trained) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 16;
        doc_piece *g = realloc(d->p, cap * sizeof *g);
        if (!g) return -1;
        d->p = g;
        d->cap = cap;
    }
    doc_piece *p = &d->p[d->n];
    p->token = token;
    p->off = d->text.n;
    p->len = len;
    p->trained = trained != 0;
    if (byte_buf_append(&d->text, s, len) != 0) return -1;
    d->n++;
    return 0;
}

int doc_pieces_text(doc_pieces *d, const char *s, size_t len, int trained) {
    return push(d, -1, s, len, trained);
}

int doc_pieces_token(doc_pieces *d, int32_t id, const char *text, int trained) {
    return push(d, id, text ? text : "", text ? strlen(text) : 0, trained);
}

void doc_pieces_clear(doc_pieces *d) {
    d->n = 0;
    d->text.n = 0;
    if (d->text.data) d->text.data[0] = '\0';
}

void doc_pieces_free(doc_pieces *d) {
    free(d->p);
    free(d->text.data);
    memset(d, 0, sizeof *d);
}

static int append_flags(byte_buf *flags, size_t n, int trained) {
    if (byte_buf_reserve(flags, n) != 0) return -1;
    memset(flags->data + flags->n, trained ? TOKEN_TRAINED : 0, n);
    flags->n += n;
    return 0;
}

/* Pieces [a, b) are one run of text: encoded once whole, each inner cut placed by
 * encoding the run's text up to it. */
static int encode_run(tokenizer *tok, const doc_pieces *d, size_t a, size_t b, token_ids *ids,
                      byte_buf *flags, token_ids *scratch, char *err, size_t errlen) {
    const char *text = d->text.data + d->p[a].off;
    const size_t len = d->p[b - 1].off + d->p[b - 1].len - d->p[a].off;
    const size_t first = ids->n;
    if (tokenizer_encode(tok, text, len, ids, err, errlen) != 0) return -1;
    const size_t whole = ids->n - first;
    size_t done = 0; /* ids of the run given to pieces before piece k */
    for (size_t k = a; k < b; k++) {
        size_t end = whole;
        if (k + 1 < b) {
            /* the cut after piece k: where the run's prefix's ids stop agreeing */
            scratch->n = 0;
            const size_t cut = d->p[k + 1].off - d->p[a].off;
            if (tokenizer_encode(tok, text, cut, scratch, err, errlen) != 0) return -1;
            end = 0;
            while (end < scratch->n && end < whole && scratch->ids[end] == ids->ids[first + end])
                end++;
            if (end < done) end = done;
        }
        if (append_flags(flags, end - done, d->p[k].trained) != 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        done = end;
    }
    return 0;
}

int doc_pieces_encode(tokenizer *tok, const doc_pieces *d, token_ids *ids, byte_buf *flags,
                      char *err, size_t errlen) {
    token_ids scratch = {0};
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < d->n;) {
        if (d->p[k].token >= 0) {
            rc = token_ids_push(ids, d->p[k].token) != 0 ||
                         append_flags(flags, 1, d->p[k].trained) != 0
                     ? -1
                     : 0;
            if (rc) snprintf(err, errlen, "out of memory");
            k++;
            continue;
        }
        size_t end = k;
        while (end < d->n && d->p[end].token < 0) end++;
        rc = encode_run(tok, d, k, end, ids, flags, &scratch, err, errlen);
        k = end;
    }
    free(scratch.ids);
    return rc;
}
