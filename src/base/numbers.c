/* Strict numbers from text (see numbers.h). */
#include "src/base/numbers.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/errmsg.h"

num_result num_parse_int(const char *s, long long *out) {
    char *end;
    /* strtoll skips leading space and takes "0x" in no base but 0: digits only here */
    if (!(isdigit((unsigned char)s[0]) || ((s[0] == '-' || s[0] == '+') && isdigit((unsigned char)s[1]))))
        return NUM_SYNTAX;
    errno = 0;
    const long long x = strtoll(s, &end, 10);
    if (*end) return NUM_SYNTAX;
    if (errno == ERANGE) return NUM_RANGE;
    *out = x;
    return NUM_OK;
}

num_result num_parse_u64(const char *s, int hex, uint64_t *out) {
    const int is_hex = hex && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    const char *digits = is_hex ? s + 2 : s;
    if (!(is_hex ? isxdigit((unsigned char)digits[0]) : isdigit((unsigned char)digits[0])))
        return NUM_SYNTAX;
    char *end;
    errno = 0;
    const unsigned long long x = strtoull(digits, &end, is_hex ? 16 : 10);
    if (*end) return NUM_SYNTAX;
    if (errno == ERANGE) return NUM_RANGE;
    *out = (uint64_t)x;
    return NUM_OK;
}

num_result num_parse_double(const char *s, double *out) {
    /* a digit or a point first, after an optional sign: no space, nan, inf; no "0x" */
    const char *p = s + (s[0] == '-' || s[0] == '+');
    if (!(isdigit((unsigned char)p[0]) || (p[0] == '.' && isdigit((unsigned char)p[1]))) ||
        strpbrk(s, "xX"))
        return NUM_SYNTAX;
    char *end;
    errno = 0;
    const double x = strtod(s, &end);
    if (*end) return NUM_SYNTAX;
    if (isinf(x)) return NUM_RANGE; /* past DBL_MAX (ERANGE); underflow gives a tiny value */
    *out = x;
    return NUM_OK;
}

void num_range_text(double lo, double hi, int open, char *out, size_t outlen) {
    if (isinf(hi))
        snprintf(out, outlen, "must be %s %.15g", open & NUM_LO_OPEN ? ">" : ">=", lo);
    else
        snprintf(out, outlen, "must be in %c%.15g, %.15g%c", open & NUM_LO_OPEN ? '(' : '[', lo,
                 hi, open & NUM_HI_OPEN ? ')' : ']');
}

/* "OPT: 'V' is WHAT" or "OPT: 'V' is out of range, RANGE" into err */
static int option_error(const char *opt, const char *v, const char *what, char *err,
                        size_t errlen) {
    io_set_err(err, errlen, "%s: '%.200s' is %s", opt, v, what);
    return -1;
}

int num_option_int(const char *opt, const char *v, long long lo, long long hi, long long *out,
                   char *err, size_t errlen) {
    long long x = 0;
    const num_result r = num_parse_int(v, &x);
    if (r == NUM_SYNTAX) return option_error(opt, v, "not an integer", err, errlen);
    if (r == NUM_RANGE || x < lo || x > hi) {
        char what[128];
        snprintf(what, sizeof what, "out of range, must be in [%lld, %lld]", lo, hi);
        return option_error(opt, v, what, err, errlen);
    }
    *out = x;
    return 0;
}

int num_option_u64(const char *opt, const char *v, uint64_t *out, char *err, size_t errlen) {
    const num_result r = num_parse_u64(v, 0, out);
    if (r == NUM_SYNTAX) return option_error(opt, v, "not an unsigned integer", err, errlen);
    if (r == NUM_RANGE) return option_error(opt, v, "out of range, must be < 2^64", err, errlen);
    return 0;
}

int num_option_double(const char *opt, const char *v, double lo, double hi, int open,
                      double *out, char *err, size_t errlen) {
    double x = 0;
    const num_result r = num_parse_double(v, &x);
    if (r == NUM_SYNTAX) return option_error(opt, v, "not a number", err, errlen);
    const int below = open & NUM_LO_OPEN ? !(x > lo) : !(x >= lo);
    const int above = open & NUM_HI_OPEN ? !(x < hi) : !(x <= hi);
    if (r == NUM_RANGE || below || above) {
        char what[128] = "out of range, ";
        num_range_text(lo, hi, open, what + strlen(what), sizeof what - strlen(what));
        return option_error(opt, v, what, err, errlen);
    }
    *out = x;
    return 0;
}
