/* Unit tests of the byte-level BPE core (src/tokenizer/bpe.c) on hand-made vocabularies, the
 * byte-level alphabet, the word memo (src/tokenizer/token_cache.c) and the incremental decoder
 * (src/tokenizer/tokenizer.c) on the byte tokenizer: nothing here needs Python or cached files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/bpe.h"
#include "src/tokenizer/token_cache.h"
#include "src/tokenizer/tokenizer.h"

#include "tests/check.h"

/* ---- the byte-level alphabet against GPT-2's bytes_to_unicode ---- */

static void test_alphabet(void) {
    /* printable Latin-1 stands for itself; the rest takes U+0100.. in byte order */
    check(bpe_byte_to_char('a') == 'a' && bpe_byte_to_char('!') == '!' &&
              bpe_byte_to_char(0xA1) == 0xA1 && bpe_byte_to_char(0xFF) == 0xFF,
          "printable bytes stand for themselves");
    check(bpe_byte_to_char(0) == 0x100 && bpe_byte_to_char(' ') == 0x120 &&
              bpe_byte_to_char('\n') == 0x10A && bpe_byte_to_char(0x7F) == 0x121 &&
              bpe_byte_to_char(0xA0) == 0x142 && bpe_byte_to_char(0xAD) == 0x143,
          "space is U+0120 (Ġ), newline U+010A (Ċ), DEL U+0121, NBSP U+0142, SHY U+0143");
    int distinct = 1, inverse = 1;
    unsigned char seen[0x200] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t c = bpe_byte_to_char((unsigned char)b);
        distinct &= c < 0x200 && !seen[c];
        if (c < 0x200) seen[c] = 1;
        inverse &= bpe_char_to_byte(c) == b;
    }
    check(distinct && inverse, "256 distinct characters, each mapping back to its byte");
    check(bpe_char_to_byte(' ') == -1 && bpe_char_to_byte(0x144) == -1 &&
              bpe_char_to_byte(0x20AC) == -1,
          "space itself, U+0144 and the euro sign stand for no byte");

    unsigned char all[256], back[256];
    for (int b = 0; b < 256; b++) all[b] = (unsigned char)b;
    byte_buf s = {0};
    size_t n = 0;
    int rc = bpe_bytes_to_bytelevel(all, 256, &s);
    int rc2 = bpe_bytelevel_to_bytes(s.data, s.n, back, &n);
    check(rc == 0 && rc2 == 0 && n == 256 && memcmp(all, back, 256) == 0,
          "all 256 bytes -> alphabet (%zu bytes of UTF-8) -> the same bytes", s.n);
    check(strncmp(s.data + 2 * 32, "\xC4\xA0", 2) == 0, "space is written as \"Ġ\"");
    free(s.data);
    check(bpe_bytelevel_to_bytes("\xC4\xA0the", 5, back, &n) == 0 && n == 4 &&
              memcmp(back, " the", 4) == 0,
          "\"Ġthe\" is \" the\"");
    check(bpe_bytelevel_to_bytes("a b", 3, back, &n) == -1 &&
              bpe_bytelevel_to_bytes("\xE2\x82\xAC", 3, back, &n) == -1 &&
              bpe_bytelevel_to_bytes("\xC4", 1, back, &n) == -1,
          "a literal space, a character outside the alphabet and cut UTF-8 are refused");
}

/* ---- merges ---- */

/* A vocabulary of the given strings (ids in order) and merges "left right" by rank. */
static bpe *make(const char *const *tokens, int n_tokens, const char *const *merges,
                 int n_merges) {
    bpe *b = bpe_create();
    for (int i = 0; i < n_tokens; i++)
        bpe_add_token(b, i, (const unsigned char *)tokens[i], strlen(tokens[i]));
    for (int i = 0; i < n_merges; i++) {
        const char *sp = strchr(merges[i], ' ');
        char both[64];
        snprintf(both, sizeof both, "%.*s%s", (int)(sp - merges[i]), merges[i], sp + 1);
        int32_t l = bpe_token_id(b, (const unsigned char *)merges[i], (size_t)(sp - merges[i]));
        int32_t r = bpe_token_id(b, (const unsigned char *)sp + 1, strlen(sp + 1));
        int32_t m = bpe_token_id(b, (const unsigned char *)both, strlen(both));
        if (l < 0 || r < 0 || m < 0) abort(); /* a broken test table */
        bpe_add_merge(b, l, r, m);
    }
    return b;
}

/* The ids of word as "i j k". */
static const char *enc(bpe *b, const char *word) {
    static char out[256];
    token_ids ids = {0};
    if (bpe_encode_word(b, (const unsigned char *)word, strlen(word), &ids) != 0) return "oom";
    out[0] = '\0';
    for (size_t i = 0; i < ids.n; i++)
        snprintf(out + strlen(out), sizeof out - strlen(out), i ? " %d" : "%d", (int)ids.ids[i]);
    free(ids.ids);
    return out;
}

static void test_merges(void) {
    static const char *const v[] = {"a", "b", "c", "ab", "bc", "abc", "aa", "aaaa"};
    /* (a b) before (b c): ab, then (ab c) */
    static const char *const m1[] = {"a b", "ab c", "b c"};
    bpe *b = make(v, 8, m1, 3);
    check(!strcmp(enc(b, "abc"), "5"), "abc with (a b) ranked first: [abc] (got %s)", enc(b, "abc"));
    bpe_free(b);
    /* (b c) first: a + bc, and no merge (a bc) */
    static const char *const m2[] = {"b c", "a b", "ab c"};
    b = make(v, 8, m2, 3);
    check(!strcmp(enc(b, "abc"), "0 4"), "abc with (b c) ranked first: [a, bc] (got %s)",
          enc(b, "abc"));
    check(!strcmp(enc(b, "cab"), "2 3"), "cab: [c, ab] (got %s)", enc(b, "cab"));
    check(!strcmp(enc(b, "abc"), "0 4"), "the same word again (from the memo): [a, bc]");
    bpe_free(b);
    /* equal ranks: the leftmost pair merges first */
    static const char *const m3[] = {"a a", "aa aa"};
    b = make(v, 8, m3, 2);
    check(!strcmp(enc(b, "aaa"), "6 0"), "aaa: [aa, a], the leftmost pair first (got %s)",
          enc(b, "aaa"));
    check(!strcmp(enc(b, "aaaa"), "7"), "aaaa: [aa, aa] then [aaaa] (got %s)", enc(b, "aaaa"));
    check(!strcmp(enc(b, "aaaaa"), "7 0"), "aaaaa: [aaaa, a] (got %s)", enc(b, "aaaaa"));
    bpe_free(b);
    /* a pair given twice takes its later rank */
    static const char *const m4[] = {"a b", "b c", "a b"};
    b = make(v, 8, m4, 3);
    check(!strcmp(enc(b, "abc"), "0 4"), "a repeated merge ranks last: [a, bc] (got %s)",
          enc(b, "abc"));
    bpe_free(b);
    /* a long word (past the memo's key limit): every merge still happens in rank order */
    char longw[2001];
    memset(longw, 'a', 2000);
    longw[2000] = '\0';
    b = make(v, 8, m3, 2);
    token_ids ids = {0};
    bpe_encode_word(b, (const unsigned char *)longw, 2000, &ids);
    int all4 = ids.n == 500;
    for (size_t i = 0; all4 && i < ids.n; i++) all4 = ids.ids[i] == 7;
    check(all4, "2000 a's: 500 x [aaaa] (got %zu ids)", ids.n);
    free(ids.ids);
    bpe_free(b);
}

static void test_options(void) {
    static const char *const v[] = {"a", "b", "c", "ab", "bc", "abc", "?"};
    static const char *const m[] = {"b c", "a b"};
    bpe *b = make(v, 7, m, 2);
    check(!strcmp(enc(b, "abc"), "0 4"), "without ignore_merges: [a, bc]");
    bpe_set_options(b, 1, -1, 0);
    check(!strcmp(enc(b, "abc"), "5"), "ignore_merges: a word in the vocabulary is one token");
    check(!strcmp(enc(b, "abca"), "0 4 0"), "ignore_merges: other words still merge");
    bpe_set_options(b, 0, -1, 0);
    check(!strcmp(enc(b, "axxb"), "3"),
          "no unk: bytes without a token are dropped, and a, b then merge (got %s)",
          enc(b, "axxb"));
    bpe_set_options(b, 0, 6, 0);
    check(!strcmp(enc(b, "axxb"), "0 6 6 1"), "unk: one per byte without a token (got %s)",
          enc(b, "axxb"));
    bpe_set_options(b, 0, 6, 1);
    check(!strcmp(enc(b, "axxbx"), "0 6 1 6"), "fuse_unk: consecutive ones fused (got %s)",
          enc(b, "axxbx"));
    bpe_free(b);
}

/* ---- the memo ---- */

static void test_cache(void) {
    token_cache *c = token_cache_create(16);
    int32_t ids[3] = {7, 8, 9};
    size_t n = 0;
    token_cache_put(c, "word", 4, ids, 3);
    const int32_t *got = token_cache_get(c, "word", 4, &n);
    check(got && n == 3 && got[0] == 7 && got[2] == 9, "a memoised word comes back");
    check(!token_cache_get(c, "wor", 3, &n) && !token_cache_get(c, "words", 5, &n),
          "its prefix and extension are not in the memo");
    char key[16];
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "k%d", i);
        int32_t id = i;
        token_cache_put(c, key, strlen(key), &id, 1);
    }
    got = token_cache_get(c, "k99", 3, &n);
    check(got && n == 1 && got[0] == 99, "after overflowing (cleared and refilled) the newest is there");
    int all_ok = 1;
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "k%d", i);
        got = token_cache_get(c, key, strlen(key), &n);
        all_ok &= !got || (n == 1 && got[0] == i); /* dropped or right, never wrong */
    }
    check(all_ok, "every entry still there is right");
    char big[TOKEN_CACHE_MAX_KEY + 1];
    memset(big, 'x', sizeof big);
    token_cache_put(c, big, sizeof big, ids, 1);
    check(!token_cache_get(c, big, sizeof big, &n), "a key over the limit is not memoised");
    token_cache_free(c);
}

/* ---- incremental decode, on the byte tokenizer (id = byte) ---- */

static void test_stream(void) {
    char err[256];
    tokenizer *t;
    if (tokenizer_open(&t, "bytes", err, sizeof err) != 0) {
        check(0, "open bytes: %s", err);
        return;
    }
    const char *text = "h\xC3\xA9\xE2\x82\xAC!\xF0\x9F\x98\x80"; /* h é € ! 😀 */
    size_t len = strlen(text);
    tokenizer_stream s;
    tokenizer_stream_init(&s, 0);
    byte_buf out = {0};
    char released[16][8];
    int n_rel = 0, ok = 1;
    for (size_t i = 0; i < len && ok; i++) {
        out.n = 0;
        ok = tokenizer_stream_push(t, &s, (unsigned char)text[i], &out, err, sizeof err) == 0;
        if (out.n && n_rel < 16) snprintf(released[n_rel++], 8, "%.*s", (int)out.n, out.data);
    }
    check(ok && n_rel == 5 && !strcmp(released[0], "h") && !strcmp(released[1], "\xC3\xA9") &&
              !strcmp(released[2], "\xE2\x82\xAC") && !strcmp(released[4], "\xF0\x9F\x98\x80"),
          "bytes one at a time: released as 5 whole characters (got %d pieces)", n_rel);
    /* an unfinished character comes out at flush */
    out.n = 0;
    tokenizer_stream_push(t, &s, 0xE2, &out, err, sizeof err);
    size_t held = out.n;
    tokenizer_stream_flush(t, &s, &out, err, sizeof err);
    check(held == 0 && out.n == 1 && (unsigned char)out.data[0] == 0xE2,
          "a lone lead byte is held, then released by flush");
    free(out.data);
    tokenizer_stream_free(&s);
    token_ids ids = {0};
    check(tokenizer_encode_with(t, "x", 1, TOKENIZER_ADD_BOS, &ids, err, sizeof err) == -1 &&
              strstr(err, "no bos"),
          "bytes has no bos: asking for one is an error: %s", err);
    free(ids.ids);
    byte_buf b = {0};
    int32_t bad = 256;
    check(tokenizer_decode(t, &bad, 1, 0, &b, err, sizeof err) == -1 && strstr(err, "256"),
          "decoding id 256 with bytes: %s", err);
    free(b.data);
    tokenizer_free(t);
}

int main(void) {
    test_alphabet();
    test_merges();
    test_options();
    test_cache();
    test_stream();
    return check_exit();
}
