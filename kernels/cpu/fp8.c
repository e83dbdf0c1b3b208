/* cpu backend FP8 emulation (kernels/ops.h "FP8"): the E4M3 and E5M2 codes, the dynamic
 * scaling rule, and the scaled TN GEMM as one OpenBLAS sgemm of the decoded values, so
 * FP8 runs and tests work on any machine and the cuda results can be checked against it. */
#include "kernels/cpu/cpu.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "kernels/host_adamw.h"

/* The parameters of a format: mantissa bits, exponent bias, largest finite value. */
typedef struct fp8_spec {
    int mant, bias;
    float fmax;
} fp8_spec;

static fp8_spec spec_of(shlm_fp8_format f) {
    return f == SHLM_FP8_E5M2 ? (fp8_spec){2, 15, 57344.0f} : (fp8_spec){3, 7, 448.0f};
}

/* fp8(x): round to nearest even, satfinite, NaN to NaN (ops.h) */
static uint8_t encode(float x, shlm_fp8_format f) {
    const fp8_spec s = spec_of(f);
    /* 0x7F is a NaN of both formats (E4M3's only positive one, E5M2's exponent 31) */
    if (isnan(x)) return 0x7F;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    /* satfinite: beyond the largest (±inf included) is the largest; everything at or
     * below it rounds onto a finite code, the largest being a grid point */
    if (a > s.fmax) a = s.fmax;
    if (a == 0.0) return sign;
    const int emin = 1 - s.bias; /* exponent of the smallest normal */
    int e;
    frexp(a, &e);
    e -= 1; /* a = 1.m · 2^e */
    if (e < emin) e = emin;
    /* the grid spacing at a's binade (subnormals: emin's); a / q is exact in double and
     * nearbyint rounds half to even under the default rounding mode */
    const double q = ldexp(1.0, e - s.mant);
    const double v = nearbyint(a / q) * q;
    if (v == 0.0) return sign;
    int ev;
    frexp(v, &ev);
    ev -= 1;
    if (ev < emin) /* subnormal: exponent field 0, v = m · 2^(emin - mant) */
        return (uint8_t)(sign | (int)(v / ldexp(1.0, emin - s.mant)));
    const int mant = (int)((v / ldexp(1.0, ev) - 1.0) * (1 << s.mant));
    return (uint8_t)(sign | ((ev + s.bias) << s.mant) | mant);
}

static float decode(uint8_t code, shlm_fp8_format f) {
    const fp8_spec s = spec_of(f);
    const int ebits = 7 - s.mant;
    const int exp = (code >> s.mant) & ((1 << ebits) - 1), mant = code & ((1 << s.mant) - 1);
    const float sign = code & 0x80 ? -1.0f : 1.0f;
    if (f == SHLM_FP8_E4M3 && exp == 15 && mant == 7) return NAN;
    if (f == SHLM_FP8_E5M2 && exp == 31) return mant ? NAN : sign * INFINITY;
    if (exp == 0) return sign * ldexpf((float)mant, 1 - s.bias - s.mant);
    return sign * ldexpf((float)((1 << s.mant) | mant), exp - s.bias - s.mant);
}

int shlm_cpu_fp8_check(char *why, size_t whylen) {
    (void)why;
    (void)whylen;
    return 0; /* emulated: runs wherever the cpu backend does */
}

/* The rule of ops.h over `rows` groups of elements (tensorwise: one group of them all):
 * group r is src[r·rs + k·ks], k < n. given_amax: NULL, or (tensorwise) the amax to use. */
static void quantize_groups(uint8_t *codes, float *scale_inv, const float *src, int rows, int n,
                            size_t rs, size_t ks, int tensorwise, shlm_fp8_format f,
                            const float *given_amax) {
    const float fmax = spec_of(f).fmax;
    float *scale = malloc((size_t)rows * sizeof(float));
    SHLM_CHECK_ALLOC(scale);
    if (given_amax) {
        for (int r = 0; r < rows; r++) scale[r] = *given_amax;
    } else {
#pragma omp parallel for schedule(static)
        for (int r = 0; r < rows; r++) {
            float amax = 0.0f;
            for (int k = 0; k < n; k++) amax = fmaxf(amax, fabsf(src[r * rs + k * ks])); /* NaN ignored */
            scale[r] = amax;
        }
    }
    if (tensorwise && !given_amax) {
        float amax = 0.0f;
        for (int r = 0; r < rows; r++) amax = fmaxf(amax, scale[r]);
        for (int r = 0; r < rows; r++) scale[r] = amax;
    }
    for (int r = 0; r < rows; r++) scale[r] = fmax / fmaxf(scale[r], 1e-12f);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < n; k++)
            codes[(size_t)r * n + k] = encode(src[r * rs + k * ks] * scale[r], f);
    if (tensorwise) scale_inv[0] = 1.0f / scale[0];
    else
        for (int r = 0; r < rows; r++) scale_inv[r] = 1.0f / scale[r];
    free(scale);
}

void shlm_cpu_fp8_quantize(const shlm_fp8_matrix *q, const void *src, int transpose) {
    if (q->rows <= 0 || q->cols <= 0) return;
    const int tensorwise = q->scaling == SHLM_FP8_TENSORWISE;
    /* q's row r: src's row r (transpose 0), or src's column r (src is cols x rows) */
    const size_t rs = transpose ? 1 : (size_t)q->cols, ks = transpose ? (size_t)q->rows : 1;
    quantize_groups(q->codes, q->scale_inv, src, q->rows, q->cols, rs, ks, tensorwise, q->format,
                    NULL);
}

void shlm_cpu_fp8_quantize_both(const shlm_fp8_matrix *q, const shlm_fp8_matrix *q_t,
                                const void *src, const float *src_amax) {
    if (q_t->rows != q->cols || q_t->cols != q->rows || q_t->format != q->format ||
        q_t->scaling != q->scaling)
        SHLM_FATAL("fp8_quantize_both: q is %dx%d, q_t %dx%d (must be its transpose, same "
                   "format and scaling)", q->rows, q->cols, q_t->rows, q_t->cols);
    if (src_amax && q->scaling != SHLM_FP8_TENSORWISE)
        SHLM_FATAL("fp8_quantize_both: a given amax with rowwise scaling (one amax per row)");
    if (!src_amax) {
        shlm_cpu_fp8_quantize(q, src, 0);
        shlm_cpu_fp8_quantize(q_t, src, 1);
        return;
    }
    if (q->rows <= 0 || q->cols <= 0) return;
    quantize_groups(q->codes, q->scale_inv, src, q->rows, q->cols, (size_t)q->cols, 1, 1,
                    q->format, src_amax);
    quantize_groups(q_t->codes, q_t->scale_inv, src, q_t->rows, q_t->cols, 1, (size_t)q_t->rows,
                    1, q->format, src_amax);
}

/* bf16(x) as the gather gives it (convert.c's rounding) */
static float round_bf16(float x) { return shlm_bf16_to_f32(shlm_f32_to_bf16(x)); }

static float param_scale(const float *amax, int round) {
    const float a = round ? round_bf16(*amax) : *amax;
    return spec_of(SHLM_FP8_E4M3).fmax / fmaxf(a, 1e-12f);
}

void shlm_cpu_fp8_param_amax(float *amax, const float *p, size_t n) { host_abs_max(amax, p, n); }

void shlm_cpu_fp8_param_scale(float *scale_inv, const float *amax, int round) {
    *scale_inv = 1.0f / param_scale(amax, round);
}

void shlm_cpu_fp8_param_cast(uint8_t *codes, const float *p, size_t n, const float *amax,
                             int round) {
    const float scale = param_scale(amax, round);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        codes[i] = encode((round ? round_bf16(p[i]) : p[i]) * scale, SHLM_FP8_E4M3);
}

void shlm_cpu_fp8_transpose(uint8_t *dst, const uint8_t *src, int rows, int cols) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
}

/* The fp32 values of q's codes, unscaled (rows x cols). */
static float *decoded(const shlm_fp8_matrix *q) {
    float table[256];
    for (int c = 0; c < 256; c++) table[c] = decode((uint8_t)c, q->format);
    const size_t n = (size_t)q->rows * q->cols;
    float *out = malloc((n ? n : 1) * sizeof(float));
    SHLM_CHECK_ALLOC(out);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = table[q->codes[i]];
    return out;
}

void shlm_cpu_matmul_fp8(void *out, int flags, const shlm_fp8_matrix *a,
                         const shlm_fp8_matrix *b, const void *c) {
    (void)flags; /* act is fp32 here: both outputs are fp32; the sums are fp32 always */
    const int M = a->rows, N = b->rows, K = a->cols;
    if (b->cols != K || a->scaling != b->scaling)
        SHLM_FATAL("matmul_fp8: a is %dx%d, b %dx%d (K must agree), scalings %d and %d", M,
                   a->cols, N, b->cols, (int)a->scaling, (int)b->scaling);
    if (a->format == SHLM_FP8_E5M2 && b->format == SHLM_FP8_E5M2)
        SHLM_FATAL("matmul_fp8: both operands are E5M2");
    if (M <= 0 || N <= 0) return;
    const size_t n = (size_t)M * N;
    float *prod = malloc(n * sizeof(float));
    SHLM_CHECK_ALLOC(prod);
    if (K > 0) {
        float *da = decoded(a), *db = decoded(b);
        /* prod(M,N) = da(M,K) · db(N,K)ᵀ, summed in fp32 */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, da, K, db, K, 0.0f,
                    prod, N);
        free(da);
        free(db);
    } else {
        memset(prod, 0, n * sizeof(float)); /* an empty sum (BLAS rejects lda = 0) */
    }
    const int rowwise = a->scaling == SHLM_FP8_ROWWISE;
    float *o = out;
    const float *cf = c;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++) {
        const float sa = a->scale_inv[rowwise ? i : 0];
        for (int j = 0; j < N; j++) {
            const size_t k = (size_t)i * N + j;
            const float v = prod[k] * sa * b->scale_inv[rowwise ? j : 0];
            o[k] = cf ? v + cf[k] : v; /* c may alias out: read before the write */
        }
    }
    free(prod);
}
