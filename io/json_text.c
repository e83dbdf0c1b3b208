/* JSON texts read with cJSON (json_text.h): one pass over the text for what cJSON would
 * cut short or misname, cJSON's parse, then a walk of the tree for keys given twice. */
#include "io/json_text.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/errmsg.h"

/* Objects with at most this many members are checked for a repeated key pair by pair;
 * larger ones (a tokenizer's vocabulary) through a sorted copy of their keys. */
enum { PAIRWISE_MAX = 16 };

/* The value of the 4 hex digits at s (n bytes there), or -1. */
static long hex4(const char *s, size_t n) {
    if (n < 4) return -1;
    long v = 0;
    for (int k = 0; k < 4; k++) {
        const char c = s[k];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | d;
    }
    return v;
}

/* The first NUL (under JSON_TEXT_NO_NUL), lone surrogate escape or nesting past cJSON's
 * limit in t[0, n): -1 with err and *at, else 0. Strings are told apart from the rest
 * (backslashes stand only in them, brackets count only outside them); anything else
 * wrong is left to cJSON. */
static int scan(const char *t, size_t n, int flags, size_t *at, char *err, size_t errlen) {
    static const char nul_why[] = "shardlm does not take one in text, where it would end a "
                                  "string";
    int depth = 0, in_string = 0;
    for (size_t i = 0; i < n; i++) {
        const char c = t[i];
        if (c == '\0' && (flags & JSON_TEXT_NO_NUL)) {
            *at = i;
            io_set_err(err, errlen, "a NUL byte (U+0000): %s", nul_why);
            return -1;
        }
        if (!in_string) {
            if (c == '"') {
                in_string = 1;
            } else if ((c == '[' || c == '{') && ++depth > CJSON_NESTING_LIMIT) {
                *at = i;
                io_set_err(err, errlen, "arrays and objects nested deeper than %d levels, the "
                           "JSON reader's limit", CJSON_NESTING_LIMIT);
                return -1;
            } else if (c == ']' || c == '}') {
                depth--;
            }
            continue;
        }
        if (c == '"') {
            in_string = 0;
            continue;
        }
        if (c != '\\' || i + 1 >= n) continue;
        if (t[i + 1] != 'u') {
            i++; /* the escaped character */
            continue;
        }
        const long u = hex4(t + i + 2, n - i - 2);
        if (u < 0) {
            i++;
            continue;
        }
        if (u == 0 && (flags & JSON_TEXT_NO_NUL)) {
            *at = i;
            io_set_err(err, errlen, "the escape \\u0000 (U+0000): %s", nul_why);
            return -1;
        }
        if (u >= 0xD800 && u <= 0xDBFF) {
            const long low = i + 7 < n && t[i + 6] == '\\' && t[i + 7] == 'u'
                                 ? hex4(t + i + 8, n - i - 8) : -1;
            if (low >= 0xDC00 && low <= 0xDFFF) {
                i += 11; /* a pair: one character */
                continue;
            }
            *at = i;
            io_set_err(err, errlen, "a lone surrogate \\u%04lx, the first half of a UTF-16 "
                       "pair without a second half (\\udc00-\\udfff) after it: no Unicode "
                       "character", u);
            return -1;
        }
        if (u >= 0xDC00 && u <= 0xDFFF) {
            *at = i;
            io_set_err(err, errlen, "a lone surrogate \\u%04lx, the second half of a UTF-16 "
                       "pair without a first half (\\ud800-\\udbff) before it: no Unicode "
                       "character", u);
            return -1;
        }
        i += 5;
    }
    return 0;
}

static int cmp_key(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A key some object under v holds twice (the first found), or NULL; *oom on no memory. */
static const char *repeated_key(const cJSON *v, int *oom) {
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return NULL;
    int n = 0;
    for (const cJSON *c = v->child; c; c = c->next) {
        const char *deeper = repeated_key(c, oom);
        if (deeper || *oom) return deeper;
        n++;
    }
    if (!cJSON_IsObject(v) || n < 2) return NULL;
    if (n <= PAIRWISE_MAX) {
        for (const cJSON *a = v->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (strcmp(a->string, b->string) == 0) return a->string;
        return NULL;
    }
    const char **keys = malloc((size_t)n * sizeof *keys);
    if (!keys) {
        *oom = 1;
        return NULL;
    }
    int k = 0;
    for (const cJSON *c = v->child; c; c = c->next) keys[k++] = c->string;
    qsort(keys, (size_t)n, sizeof *keys, cmp_key);
    const char *twice = NULL;
    for (k = 1; k < n && !twice; k++)
        if (strcmp(keys[k - 1], keys[k]) == 0) twice = keys[k];
    free(keys);
    return twice;
}

static int blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

cJSON *json_text_parse(const char *text, size_t len, int flags, size_t *at, char *err,
                       size_t errlen) {
    *at = (size_t)-1;
    if (scan(text, len, flags, at, err, errlen) != 0) return NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        const char *where = cJSON_GetErrorPtr();
        if (where >= text && where <= text + len) *at = (size_t)(where - text);
        io_set_err(err, errlen, "%s", *at >= len ? "not a JSON value: it ends before the value "
                                                    "does (truncated?)"
                                                  : "not a JSON value (corrupt or "
                                                    "truncated?)");
        return NULL;
    }
    size_t rest = (size_t)(end - text);
    while (rest < len && blank(text[rest])) rest++;
    if (rest < len) {
        *at = rest;
        io_set_err(err, errlen, "text follows the JSON value");
        cJSON_Delete(root);
        return NULL;
    }
    if (flags & JSON_TEXT_UNIQUE_KEYS) {
        int oom = 0;
        const char *twice = repeated_key(root, &oom);
        if (twice || oom) {
            if (oom) io_set_err(err, errlen, "out of memory");
            else io_set_err(err, errlen, "the key \"%.80s\" appears twice in one object (JSON "
                            "readers differ on which one counts: cJSON takes the first, "
                            "Python's json the last)", twice);
            cJSON_Delete(root);
            return NULL;
        }
    }
    return root;
}

cJSON *json_text_parse_file(const char *path, const char *text, size_t len, int flags,
                            char *err, size_t errlen) {
    size_t at;
    char why[512];
    cJSON *root = json_text_parse(text, len, flags, &at, why, sizeof why);
    if (root) return root;
    unsigned long long line;
    size_t byte;
    if (at > len) {
        io_set_err(err, errlen, "%s: %s", path, why);
    } else {
        io_text_position(text, at, &line, &byte);
        io_set_err(err, errlen, "%s:%llu: %s " IO_AT_BYTE, path, line, why, byte);
    }
    return NULL;
}
