/* UTF-8 as the tokenizers need it: the length of one well-formed character (no overlong
 * forms, no surrogates, nothing past U+10FFFF: the rule python's str, Rust's str and
 * SentencePiece's DecodeUTF8 share), and decoding one. */
#ifndef SHLM_UTF8_H
#define SHLM_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of the well-formed character at s[0, n), or 0 when it is malformed or cut. */
static inline size_t utf8_valid_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!need || need > n) return 0;
    for (size_t k = 1; k < need; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || (c == 0xF0 && s[1] < 0x90) ||
        (c == 0xF4 && s[1] > 0x8F))
        return 0;
    return need;
}

/* The code point of the (well-formed) character at s; *len its bytes. */
static inline uint32_t utf8_decode(const unsigned char *s, size_t *len) {
    unsigned char c = s[0];
    *len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (*len == 1) return c;
    uint32_t cp = c & (0xFF >> (*len + 1));
    for (size_t k = 1; k < *len; k++) cp = cp << 6 | (s[k] & 0x3F);
    return cp;
}

#endif
