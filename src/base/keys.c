/* Typed key tables (keys.h): parsing a value's text into its field, formatting a field
 * back, bounds, comparing two structs' fields. */
#include "src/base/keys.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "io/errmsg.h"
#include "src/base/numbers.h"

#define IMAX ((double)INT_MAX)
#define FMAX ((double)FLT_MAX)

/* Strips surrounding double quotes and decodes \" \\ \n \t inside them. */
static int unquote(const char *v, char *out, size_t outlen, char *why, size_t whylen) {
    size_t len = strlen(v);
    if (len < 2 || v[0] != '"' || v[len - 1] != '"') {
        if (len >= outlen) {
            io_set_err(why, whylen, "longer than %zu characters", outlen - 1);
            return -1;
        }
        memcpy(out, v, len + 1);
        return 0;
    }
    size_t n = 0;
    for (size_t i = 1; i < len - 1; i++) {
        char c = v[i];
        if (c == '\\') {
            char e = i + 1 < len - 1 ? v[++i] : '\0';
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e == '"' ? '"' : e == '\\' ? '\\' : 0;
            if (!c) {
                io_set_err(why, whylen, "bad escape '\\%c' (use \\\" \\\\ \\n \\t)", e ? e : ' ');
                return -1;
            }
        }
        if (n + 1 >= outlen) {
            io_set_err(why, whylen, "longer than %zu characters", outlen - 1);
            return -1;
        }
        out[n++] = c;
    }
    out[n] = '\0';
    return 0;
}

/* An integer key's bounds are said in full (the int's own limit included: a value past it
 * is out of range, not "must be >= 1"); a float key's unbounded top is left out. */
void key_range_text(const key_def *k, char *out, size_t outlen) {
    const int open = (k->flags & KF_MIN_OPEN ? NUM_LO_OPEN : 0) |
                     (k->flags & KF_MAX_OPEN ? NUM_HI_OPEN : 0);
    num_range_text(k->min, k->type == KT_FLOAT && k->max >= FMAX ? HUGE_VAL : k->max, open, out,
                   outlen);
}

int key_in_range(const key_def *k, double v) {
    if (k->flags & KF_MIN_OPEN ? !(v > k->min) : !(v >= k->min)) return 0;
    if (k->flags & KF_MAX_OPEN ? !(v < k->max) : !(v <= k->max)) return 0;
    return 1;
}

int key_parse(const key_def *k, const char *v, void *base, char *why, size_t whylen) {
    char *field = (char *)base + k->offset;
    char range[96];
    num_result r;
    switch (k->type) {
    case KT_INT: {
        long long x = 0;
        if ((r = num_parse_int(v, &x)) == NUM_SYNTAX) {
            io_set_err(why, whylen, "not an integer");
            return -1;
        }
        if (r == NUM_RANGE || x < INT_MIN || x > INT_MAX || !key_in_range(k, (double)x)) {
            key_range_text(k, range, sizeof range);
            io_set_err(why, whylen, "out of range, %s", range);
            return -1;
        }
        *(int *)field = (int)x;
        return 0;
    }
    case KT_FLOAT: {
        double x = 0;
        if ((r = num_parse_double(v, &x)) == NUM_SYNTAX) {
            io_set_err(why, whylen, "not a number");
            return -1;
        }
        /* the range applies to the float that is stored: 1e-50 would be stored as 0 */
        float f = (float)x;
        if (r == NUM_RANGE || fabs(x) > FLT_MAX || !key_in_range(k, (double)f)) {
            key_range_text(k, range, sizeof range);
            io_set_err(why, whylen, "out of range, %s", range);
            return -1;
        }
        *(float *)field = f;
        return 0;
    }
    case KT_U64: {
        uint64_t x = 0;
        if ((r = num_parse_u64(v, 1, &x)) == NUM_SYNTAX) {
            io_set_err(why, whylen, "not an unsigned integer");
            return -1;
        }
        if (r == NUM_RANGE) {
            io_set_err(why, whylen, "out of range, must be < 2^64");
            return -1;
        }
        *(uint64_t *)field = (uint64_t)x;
        return 0;
    }
    case KT_BOOL: {
        static const char *const yes[] = {"true", "yes", "on", "1"};
        static const char *const no[] = {"false", "no", "off", "0"};
        for (int i = 0; i < 4; i++) {
            if (strcasecmp(v, yes[i]) == 0) return *(int *)field = 1, 0;
            if (strcasecmp(v, no[i]) == 0) return *(int *)field = 0, 0;
        }
        io_set_err(why, whylen, "not a boolean (true or false)");
        return -1;
    }
    case KT_STRING: {
        char buf[1024];
        if (unquote(v, buf, k->size < sizeof buf ? k->size : sizeof buf, why, whylen) != 0)
            return -1;
        memcpy(field, buf, strlen(buf) + 1);
        return 0;
    }
    case KT_ENUM: {
        size_t n = strlen(v);
        int index = 0;
        for (const char *c = k->choices; *c; index++) {
            size_t len = strcspn(c, "|");
            if (len == n && strncmp(c, v, n) == 0) {
                *(int *)field = index;
                return 0;
            }
            c += len + (c[len] == '|');
        }
        io_set_err(why, whylen, "not one of %s", k->choices);
        return -1;
    }
    }
    io_set_err(why, whylen, "internal error: bad key type");
    return -1;
}

const char *key_choice_word(const char *choices, int index, char *out, size_t outlen) {
    const char *c = choices;
    for (int i = 0; *c && i < index; i++) c += strcspn(c, "|") + (c[strcspn(c, "|")] == '|');
    size_t len = strcspn(c, "|");
    if (index < 0 || !*c) len = 0;
    snprintf(out, outlen, "%.*s", (int)len, len ? c : "?");
    return out;
}

void key_format(const key_def *k, const void *base, char *out, size_t outlen) {
    const char *field = (const char *)base + k->offset;
    switch (k->type) {
    case KT_INT: snprintf(out, outlen, "%d", *(const int *)field); break;
    case KT_FLOAT: snprintf(out, outlen, "%g", *(const float *)field); break;
    case KT_U64: snprintf(out, outlen, "%llu", (unsigned long long)*(const uint64_t *)field); break;
    case KT_BOOL: snprintf(out, outlen, "%s", *(const int *)field ? "true" : "false"); break;
    case KT_ENUM: key_choice_word(k->choices, *(const int *)field, out, outlen); break;
    case KT_STRING: {
        /* quote only what would not read back as itself */
        const char *s = field;
        int plain = s[0] && !isspace((unsigned char)s[0]) && !isspace((unsigned char)s[strlen(s) - 1]) &&
                    s[0] != '"' && !strpbrk(s, "\n\t;");
        if (plain) {
            snprintf(out, outlen, "%s", s);
        } else {
            size_t n = 0;
            if (n + 1 < outlen) out[n++] = '"';
            for (; *s && n + 3 < outlen; s++) {
                char esc = *s == '\n' ? 'n' : *s == '\t' ? 't' : *s == '"' ? '"' : *s == '\\' ? '\\' : 0;
                if (esc) out[n++] = '\\', out[n++] = esc;
                else out[n++] = *s;
            }
            if (n + 1 < outlen) out[n++] = '"';
            out[n] = '\0';
        }
        break;
    }
    }
}

double key_number(const key_def *k, const void *base) {
    const char *field = (const char *)base + k->offset;
    switch (k->type) {
    case KT_INT:
    case KT_BOOL:
    case KT_ENUM: return *(const int *)field;
    case KT_FLOAT: return *(const float *)field;
    case KT_U64: return (double)*(const uint64_t *)field;
    case KT_STRING: break;
    }
    return 0;
}

int key_equal(const key_def *k, const void *a, const void *b) {
    const char *x = (const char *)a + k->offset, *y = (const char *)b + k->offset;
    switch (k->type) {
    case KT_FLOAT: {
        const float fx = *(const float *)x, fy = *(const float *)y;
        return fabsf(fx - fy) <= 1e-6f * fabsf(fy);
    }
    case KT_U64: return *(const uint64_t *)x == *(const uint64_t *)y;
    case KT_STRING: return strcmp(x, y) == 0;
    default: return *(const int *)x == *(const int *)y;
    }
}

int key_check_number(const key_def *k, double v, char *why, size_t whylen) {
    char range[96];
    switch (k->type) {
    case KT_INT:
    case KT_ENUM:
        if (v != floor(v)) break;
        if (!(v >= INT_MIN && v <= INT_MAX) || !key_in_range(k, v)) {
            key_range_text(k, range, sizeof range);
            io_set_err(why, whylen, "out of range, %s", range);
            return -1;
        }
        return 0;
    case KT_FLOAT:
        if (!isfinite(v)) {
            io_set_err(why, whylen, "not a number");
            return -1;
        }
        if (fabs(v) > FLT_MAX || !key_in_range(k, v)) {
            key_range_text(k, range, sizeof range);
            io_set_err(why, whylen, "out of range, %s", range);
            return -1;
        }
        return 0;
    case KT_BOOL:
        if (v == 0 || v == 1) return 0;
        io_set_err(why, whylen, "not a boolean (0 or 1)");
        return -1;
    case KT_U64:
        if (v >= 0 && v == floor(v)) return 0;
        io_set_err(why, whylen, "not an unsigned integer");
        return -1;
    case KT_STRING:
        io_set_err(why, whylen, "internal error: %s.%s is not a number", k->section, k->key);
        return -1;
    }
    io_set_err(why, whylen, "not an integer");
    return -1;
}
