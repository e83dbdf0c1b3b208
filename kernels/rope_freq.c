/* RoPE's frequencies from a rope type and its parameters (rope_freq.h): default, linear
 * and Llama 3.1's bands, in double, as transformers' ROPE_INIT_FUNCTIONS define them. */
#include "kernels/rope_freq.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const type_names[] = {
    [SHLM_ROPE_DEFAULT] = "default",
    [SHLM_ROPE_LINEAR] = "linear",
    [SHLM_ROPE_LLAMA3] = "llama3",
};
enum { N_TYPES = sizeof type_names / sizeof type_names[0] };

const char *shlm_rope_type_name(shlm_rope_type t) {
    return (unsigned)t < N_TYPES ? type_names[t] : "unknown";
}

int shlm_rope_type_parse(const char *name, shlm_rope_type *out) {
    for (int k = 0; k < N_TYPES; k++)
        if (name && strcmp(name, type_names[k]) == 0) {
            *out = (shlm_rope_type)k;
            return 0;
        }
    return -1;
}

const char *shlm_rope_type_names(void) { return "default linear llama3"; }

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int positive(double x) { return isfinite(x) && x > 0.0; }

/* Llama 3.1's rule for one frequency (rope_freq.h), in transformers' order of operations */
static double llama3_freq(double base, const shlm_rope_params *p) {
    const double orig = (double)p->original_max_position_embeddings;
    const double low_wavelen = orig / p->low_freq_factor;
    const double high_wavelen = orig / p->high_freq_factor;
    const double wavelen = 2.0 * M_PI / base;
    if (wavelen < high_wavelen) return base;
    if (wavelen > low_wavelen) return base / p->factor;
    const double s =
        (orig / wavelen - p->low_freq_factor) / (p->high_freq_factor - p->low_freq_factor);
    return (1.0 - s) * base / p->factor + s * base;
}

static const char *const hf_names[SHLM_ROPE_N_FIELDS] = {
    [SHLM_ROPE_F_HEAD_DIM] = "head_dim",
    [SHLM_ROPE_F_THETA] = "rope_theta",
    [SHLM_ROPE_F_TYPE] = "rope_type",
    [SHLM_ROPE_F_FACTOR] = "factor",
    [SHLM_ROPE_F_LOW_FREQ_FACTOR] = "low_freq_factor",
    [SHLM_ROPE_F_HIGH_FREQ_FACTOR] = "high_freq_factor",
    [SHLM_ROPE_F_ORIGINAL_MAX_POS] = "original_max_position_embeddings",
};

int shlm_rope_check(int head_dim, const shlm_rope_params *p, const char *const *names,
                    shlm_rope_field *bad, char *err, size_t errlen) {
    const char *const *n = names ? names : hf_names;
#define BAD(field, ...)                                                                    \
    do {                                                                                   \
        if (bad) *bad = (field);                                                           \
        return fail(err, errlen, __VA_ARGS__);                                             \
    } while (0)
    if (head_dim < 2 || head_dim > SHLM_ROPE_MAX_HEAD_DIM || head_dim % 2 != 0)
        BAD(SHLM_ROPE_F_HEAD_DIM, "RoPE needs an even %s from 2 to %d (got %d)",
            n[SHLM_ROPE_F_HEAD_DIM], SHLM_ROPE_MAX_HEAD_DIM, head_dim);
    if (!positive(p->theta))
        BAD(SHLM_ROPE_F_THETA, "%s must be a finite number > 0 (got %g)", n[SHLM_ROPE_F_THETA],
            p->theta);
    const char *tn = shlm_rope_type_name(p->type), *ty = n[SHLM_ROPE_F_TYPE];
    if (p->type != SHLM_ROPE_DEFAULT && p->type != SHLM_ROPE_LINEAR &&
        p->type != SHLM_ROPE_LLAMA3)
        BAD(SHLM_ROPE_F_TYPE, "unknown %s %d (known: %s)", ty, (int)p->type,
            shlm_rope_type_names());
    if (p->type != SHLM_ROPE_DEFAULT && !positive(p->factor))
        BAD(SHLM_ROPE_F_FACTOR, "%s %s: %s must be a finite number > 0 (got %g)", ty, tn,
            n[SHLM_ROPE_F_FACTOR], p->factor);
    if (p->type == SHLM_ROPE_LLAMA3) {
        if (!positive(p->low_freq_factor))
            BAD(SHLM_ROPE_F_LOW_FREQ_FACTOR, "%s %s: %s must be > 0 (got %g)", ty, tn,
                n[SHLM_ROPE_F_LOW_FREQ_FACTOR], p->low_freq_factor);
        if (!(isfinite(p->high_freq_factor) && p->high_freq_factor > p->low_freq_factor))
            BAD(SHLM_ROPE_F_HIGH_FREQ_FACTOR, "%s %s: %s (%g) must be greater than %s (%g)", ty,
                tn, n[SHLM_ROPE_F_HIGH_FREQ_FACTOR], p->high_freq_factor,
                n[SHLM_ROPE_F_LOW_FREQ_FACTOR], p->low_freq_factor);
        if (p->original_max_position_embeddings <= 0)
            BAD(SHLM_ROPE_F_ORIGINAL_MAX_POS, "%s %s: %s must be > 0 (got %d)", ty, tn,
                n[SHLM_ROPE_F_ORIGINAL_MAX_POS], p->original_max_position_embeddings);
    }
    return 0;
#undef BAD
}

int shlm_rope_init(shlm_rope *r, int head_dim, const shlm_rope_params *p, char *err,
                   size_t errlen) {
    memset(r, 0, sizeof *r);
    if (shlm_rope_check(head_dim, p, NULL, NULL, err, errlen) != 0) return -1;
    r->head_dim = head_dim;
    for (int i = 0; i < head_dim / 2; i++) {
        const double base = pow(p->theta, -2.0 * i / head_dim);
        r->freq[i] = p->type == SHLM_ROPE_LINEAR   ? base / p->factor
                     : p->type == SHLM_ROPE_LLAMA3 ? llama3_freq(base, p)
                                                   : base;
    }
    return 0;
}
