/* Numbers from text, strictly: one rule for job keys (src/job/config.c) and for every
 * command-line option that takes a number, so "", " 5", "5x", "0x10", "nan", "inf" and
 * a value past the type are refused everywhere with the same words. */
#ifndef SHLM_NUMBERS_H
#define SHLM_NUMBERS_H

#include <stddef.h>
#include <stdint.h>

/* What a parse found. */
typedef enum num_result {
    NUM_OK = 0,
    NUM_SYNTAX = -1, /* not a number of the kind asked for */
    NUM_RANGE = -2   /* a number of that kind, past what the type holds */
} num_result;

/* In each, the whole of s is the number: no space before or after it, nothing after it;
 * *out is set on NUM_OK only. A decimal integer with an optional sign, within long long: */
num_result num_parse_int(const char *s, long long *out);
/* Decimal digits (no sign), or with hex 0x and hexadecimal digits, within 64 bits. */
num_result num_parse_u64(const char *s, int hex, uint64_t *out);
/* A decimal floating-point number (no hexadecimal float, nan or inf), finite as a double
 * (1e999: NUM_RANGE). */
num_result num_parse_double(const char *s, double *out);

/* Bounds of num_option_double: the low or high end excluded. */
enum { NUM_LO_OPEN = 1, NUM_HI_OPEN = 2 };

/* "must be in [lo, hi]", "must be in (0, 1]", or "must be >= 0" where hi is HUGE_VAL. */
void num_range_text(double lo, double hi, int open, char *out, size_t outlen);

/* An option's value (opt: "--seed"), 0 or -1 with one line in err naming the option and
 * the value: "--seed: '' is not an integer", "--top-p: '2' is out of range, must be in
 * (0, 1]". */
int num_option_int(const char *opt, const char *v, long long lo, long long hi, long long *out,
                   char *err, size_t errlen);
/* Any 64-bit unsigned value, decimal digits only. */
int num_option_u64(const char *opt, const char *v, uint64_t *out, char *err, size_t errlen);
int num_option_double(const char *opt, const char *v, double lo, double hi, int open,
                      double *out, char *err, size_t errlen);

#endif
