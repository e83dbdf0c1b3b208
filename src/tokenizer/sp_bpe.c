/* SentencePiece BPE encoding (sp_bpe.h): the library's merge order (a heap of candidate
 * pairs keyed by (score, left position); a popped pair is used only if both symbols are
 * still there with the lengths it was made from), with flat scratch buffers reused across
 * calls. */
#include "src/tokenizer/sp_bpe.h"

#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/id_map.h"
#include "src/tokenizer/merge_heap.h"
#include "src/base/utf8.h"

struct sp_bpe {
    id_map *mergeable; /* normal pieces: what a merge may produce */
    id_map *all;       /* every piece -> id (PieceToId) */
    float *score;      /* by id */
    int32_t n, unk;
    int32_t byte_id[256]; /* <0xXX> pieces, -1: none */
    int byte_fallback;
    /* scratch of one call: the normalised text, its symbols, the heap */
    char *norm;
    size_t norm_cap;
    uint32_t *off, *len;
    int32_t *prev, *next;
    merge_heap heap; /* key: minus the merged piece's score; tag: its bytes */
    size_t sym_cap;
};

sp_bpe *sp_bpe_create(int32_t n, int32_t unk, int byte_fallback) {
    sp_bpe *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->n = n;
    m->unk = unk;
    m->byte_fallback = byte_fallback;
    memset(m->byte_id, 0xFF, sizeof m->byte_id);
    m->mergeable = id_map_create();
    m->all = id_map_create();
    m->score = calloc((size_t)(n > 0 ? n : 1), sizeof *m->score);
    if (!m->mergeable || !m->all || !m->score) {
        sp_bpe_free(m);
        return NULL;
    }
    return m;
}

void sp_bpe_free(sp_bpe *m) {
    if (!m) return;
    id_map_free(m->mergeable);
    id_map_free(m->all);
    free(m->score);
    free(m->norm);
    free(m->off);
    free(m->len);
    free(m->prev);
    free(m->next);
    free(m->heap.items);
    free(m);
}

int sp_bpe_add_piece(sp_bpe *m, int32_t id, const char *piece, size_t len, float score,
                     int mergeable) {
    if (id < 0 || id >= m->n) return -1;
    m->score[id] = score;
    if (id_map_add(m->all, piece, len, id) < 0) return -1;
    if (mergeable && id_map_add(m->mergeable, piece, len, id) < 0) return -1;
    /* "<0xAB>": the byte-fallback piece of byte 0xAB */
    if (len == 6 && !memcmp(piece, "<0x", 3) && piece[5] == '>') {
        char *end;
        char hex[3] = {piece[3], piece[4], 0};
        long b = strtol(hex, &end, 16);
        if (!*end && b >= 0 && b < 256) m->byte_id[b] = id;
    }
    return 0;
}

static int reserve(sp_bpe *m, size_t text_len) {
    size_t need = 3 * text_len + 3; /* every byte may become U+FFFD or "▁" */
    if (need > m->norm_cap) {
        char *g = realloc(m->norm, need);
        if (!g) return -1;
        m->norm = g;
        m->norm_cap = need;
    }
    if (need > m->sym_cap) {
        uint32_t *o = realloc(m->off, need * sizeof *o);
        if (o) m->off = o;
        uint32_t *l = realloc(m->len, need * sizeof *l);
        if (l) m->len = l;
        int32_t *p = realloc(m->prev, need * sizeof *p);
        if (p) m->prev = p;
        int32_t *x = realloc(m->next, need * sizeof *x);
        if (x) m->next = x;
        merge_cand *h = realloc(m->heap.items, 3 * need * sizeof *h);
        if (h) m->heap.items = h;
        if (!o || !l || !p || !x || !h) return -1;
        m->sym_cap = need;
    }
    return 0;
}

/* the candidate merge of symbols left and right (adjacent, so contiguous in norm) */
static void maybe_add(sp_bpe *m, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    uint32_t size = m->len[left] + m->len[right];
    int32_t id = id_map_get(m->mergeable, m->norm + m->off[left], size);
    if (id >= 0) merge_heap_push(&m->heap, (merge_cand){-m->score[id], left, right, size});
}

int sp_bpe_encode(sp_bpe *m, const char *text, size_t len, int dummy_prefix, token_ids *out) {
    if (len == 0) return 0;
    if (reserve(m, len) != 0) return -1;
    /* normalise, one symbol per character */
    size_t k = 0;
    int32_t n = 0;
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len || (dummy_prefix && n == 0);) {
        size_t start = k, adv;
        if (dummy_prefix && n == 0) {
            memcpy(m->norm + k, "\xE2\x96\x81", 3), k += 3, adv = 0;
        } else if (s[i] == ' ') {
            memcpy(m->norm + k, "\xE2\x96\x81", 3), k += 3, adv = 1;
        } else if ((adv = utf8_valid_len(s + i, len - i)) > 0) {
            memcpy(m->norm + k, s + i, adv), k += adv;
        } else {
            memcpy(m->norm + k, "\xEF\xBF\xBD", 3), k += 3, adv = 1;
        }
        i += adv;
        m->off[n] = (uint32_t)start;
        m->len[n] = (uint32_t)(k - start);
        m->prev[n] = n - 1;
        m->next[n] = n + 1;
        n++;
    }
    m->next[n - 1] = -1;
    m->heap.n = 0;
    for (int32_t i = 1; i < n; i++) maybe_add(m, i - 1, i);
    while (m->heap.n) {
        merge_cand top = merge_heap_pop(&m->heap);
        int32_t left = top.pos, right = top.right;
        if (!m->len[left] || !m->len[right] || m->len[left] + m->len[right] != top.tag) continue;
        m->len[left] = top.tag;
        m->next[left] = m->next[right];
        if (m->next[right] >= 0) m->prev[m->next[right]] = left;
        m->len[right] = 0;
        maybe_add(m, m->prev[left], left);
        maybe_add(m, left, m->next[left]);
    }
    int prev_unk = 0;
    for (int32_t i = 0; i >= 0; i = m->next[i]) {
        const char *p = m->norm + m->off[i];
        int32_t id = id_map_get(m->all, p, m->len[i]);
        if (id >= 0 && id != m->unk) {
            if (token_ids_push(out, id) != 0) return -1;
            prev_unk = 0;
        } else if (m->byte_fallback) {
            for (uint32_t b = 0; b < m->len[i]; b++) {
                int32_t bid = m->byte_id[(unsigned char)p[b]];
                if (token_ids_push(out, bid >= 0 ? bid : m->unk) != 0) return -1;
            }
        } else {
            if (!prev_unk && token_ids_push(out, m->unk) != 0) return -1;
            prev_unk = 1;
        }
    }
    return 0;
}
