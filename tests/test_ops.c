/* The op-test harness of every compute backend: each op of the shlm_ops table
 * (kernels/ops.h), forward and backward, against double-precision references written
 * here, and on a backend other than cpu also against the cpu backend where agreement is
 * the contract. */

/* Usage: test_ops [--backend NAME] [--seed N] [--group NAME] [--small]
 *   --backend  cpu (the default, run by `make check`) or cuda (`make check-gpu`); a backend
 *              that is built in but finds no device exits 77 (skipped)
 *   --seed     the inputs' random seed
 *   --group    one group only: backends memory convert embedding rmsnorm matmul bias rope
 *              attention swiglu decode xent adamw reductions determinism fp8 nf4
 *   --small    leave out the Llama-sized cases (quick enough for compute-sanitizer)
 *
 * Three kinds of check; every line names its row of tol_table, where each tolerance is
 * given with its reason:
 * 1. Reference: the backend's result a against the double reference b computed from the
 *    same inputs (act inputs are drawn representable in the backend's act dtype, so both
 *    see the same values): max_i |a_i - b_i| / max_i |b_i| < tol. Shapes: tiny (one row,
 *    widths of 1 or 2), odd (not a multiple of any vector width or tile), the tile edges of
 *    the device kernels (attention T = 65, 129, 300 against 64- and 128-row tiles, hd 20,
 *    64, 100, 128), document masks, and on device backends the Llama-sized shapes of the
 *    ops whose references are linear in the data (embedding, rmsnorm, rope, swiglu, xent).
 * 2. Finite differences: each reference backward against central differences of the
 *    reference forward at a dozen random coordinates, so that a wrong reference cannot
 *    pass a wrong kernel.
 * 3. Against the cpu backend (device backends only): matmul and attention at Llama sizes,
 *    where a double loop would take minutes, against the cpu backend (itself held to the
 *    double reference by 1.) by relative L2 error ||a - c|| / ||c||; and bit-identity
 *    where both backends do the same fp32 operations in the same order (embedding_bwd,
 *    adamw, accumulate).
 * Outputs an op overwrites ("=") are filled with NaN first, so an element it leaves
 * unwritten fails. Every check prints one line; the exit status is 0 when all pass, 1
 * when one fails, 2 on bad usage. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"
#include "tests/check.h"
#include "tests/doc_layout.h"

#define FD_COORDS 12

static const shlm_ops *ops;                       /* the backend under test */
static const shlm_ops *const cpu = &shlm_ops_cpu; /* the comparison of device backends */
static int is_cpu;     /* cpu-only properties (thread invariance, documented aliasing) */
static int small_only; /* --small: no Llama-sized cases */

/* ------------------------------------------------------------------------------------
 * tolerances: one row per op output, its value on a backend whose act dtype is fp32 and
 * on one whose act dtype is bf16, and the reason. bf16 keeps 8 significant bits: one
 * rounding moves a value by up to 2^-9 of itself (2e-3). On an H200 (cuda, the default
 * seed) the largest errors sit 2.6 to 8 times below the tolerances of bf16 outputs (the
 * closest: attention rope 7.6e-3, attention dqkv 1.3e-2) and 10 to 50 times below those
 * of fp32 outputs (the closest: xent losses 2.1e-6). */
enum crit {
    CRIT_MAXREL, /* max_i |a_i - b_i| / max_i |b_i| (tol 0: the same values) */
    CRIT_L2      /* ||a - b||_2 / ||b||_2 */
};
typedef enum tol_id {
    T_BITS,
    T_FD,
    T_EMB_BWD,
    T_RMS_ACT,
    T_RMS_F32,
    T_MM_ACT,
    T_MM_DW,
    T_BIAS_ADD,
    T_BIAS_GRAD,
    T_ROPE,
    T_ROPE_LONG,
    T_ATT_OUT,
    T_ATT_LSE,
    T_ATT_BWD,
    T_ATT_ROPE_FUSED,
    T_DECODE,
    T_SWIGLU,
    T_XENT_LOSS,
    T_XENT_DLOGITS,
    T_ADAMW,
    T_SUMSQ,
    T_ACCUM,
    T_CPU_ACT,
    T_CPU_F32,
    T_CPU_ATT_BWD,
    T_FP8_ACT,
    T_FP8_F32,
    T_NF4,
    T_COUNT
} tol_id;
static const struct tol_row {
    const char *name;
    enum crit crit;
    double fp32, bf16;
    const char *why;
} tol_table[T_COUNT] = {
    [T_BITS] = {"bits", CRIT_MAXREL, 0, 0,
                "copies, conversions, masks that must give doc_start NULL's results, reruns, "
                "and ops that do the same fp32 operations in the same order as the cpu"},
    [T_FD] = {"fd", CRIT_MAXREL, 1e-6, 1e-6,
              "central differences in double with h = 1e-5: truncation h^2 f'''/6 and "
              "cancellation 1e-16/h are both ~1e-11 of the gradient"},
    [T_EMB_BWD] = {"embedding_bwd", CRIT_MAXREL, 1e-6, 1e-6,
                   "fp32 sums of a few exactly representable rows onto fp32: a few roundings "
                   "of 2^-24"},
    [T_RMS_ACT] = {"rmsnorm act", CRIT_MAXREL, 1e-5, 2e-2,
                   "out and dinp: C-term fp32 sums (fp32: ~1e-6), rounded once to bf16 "
                   "after the rstd and weight products (bf16: a few 2^-9)"},
    [T_RMS_F32] = {"rmsnorm fp32", CRIT_MAXREL, 1e-5, 1e-5,
                   "rstd and dweight are fp32 sums over C or N products of exact operands; a "
                   "device sums in another order, through partials, with rsqrtf (2 ulp)"},
    [T_MM_ACT] = {"matmul act", CRIT_MAXREL, 1e-5, 2e-2,
                  "out and dinp: K-term fp32 dot products, rounded once to bf16 (and again "
                  "per += onto a bf16 buffer)"},
    [T_MM_DW] = {"matmul dweight", CRIT_MAXREL, 1e-5, 1e-5,
                 "fp32 dweight: N-term dot products of exact bf16 operands in the tensor "
                 "cores' fp32 order"},
    [T_BIAS_ADD] = {"bias_add", CRIT_MAXREL, 1e-6, 2e-2,
                    "one fp32 addition per element (2^-24 of the larger term); bf16 rounds the "
                    "output once"},
    [T_BIAS_GRAD] = {"bias_grad", CRIT_MAXREL, 1e-5, 1e-5,
                     "fp32 column sums of N exact act values (a few 2^-24 per term relative "
                     "to the largest sum); a device sums in another fixed order"},
    [T_ROPE] = {"rope", CRIT_MAXREL, 1e-5, 2e-2,
                "a 2x2 rotation per pair; angles in fp32 are ~1e-6 off at positions < 100; "
                "bf16 rounds the output once"},
    [T_ROPE_LONG] = {"rope long", CRIT_MAXREL, 1e-6, 2e-2,
                     "positions up to 4095: pos * freq formed in fp32 would be ~2e-4 off, so "
                     "an fp32 backend must form the angle in double (bf16 rounds anyway)"},
    [T_ATT_OUT] = {"attention out", CRIT_MAXREL, 1e-5, 2e-2,
                   "softmax rows of T terms in fp32; bf16: P rounded to bf16 before P.V (as "
                   "in every flash attention), then the output"},
    [T_ATT_LSE] = {"attention lse", CRIT_MAXREL, 1e-5, 1e-5,
                   "fp32 logsumexp of fp32 scores; a device uses ex2.approx (2 ulp) and "
                   "tensor-core sums"},
    [T_ATT_BWD] = {"attention dqkv", CRIT_MAXREL, 1e-5, 5e-2,
                   "dq, dk, dv (each part on its own): bf16 rounds P, dS and the forward's "
                   "out (in rowsum(dO.O)) before their products, and dqkv once"},
    [T_ATT_ROPE_FUSED] = {"attention rope", CRIT_MAXREL, 0, 2e-2,
                          "attention_bwd with rope against the backend's own backward then rope: the "
                          "same call on cpu (ops.h); a device rotates fp32 accumulators and "
                          "rounds once where the pair rounds twice"},
    [T_DECODE] = {"attention_decode", CRIT_MAXREL, 1e-5, 1e-2,
                  "softmax rows of up to cap terms in fp32; bf16: P stays fp32 (no rounding "
                  "before P.V), out rounds once (2^-9 of an element), ex2.approx (2 ulp)"},
    [T_SWIGLU] = {"swiglu", CRIT_MAXREL, 1e-5, 2e-2,
                  "a few fp32 operations per element (exp included); bf16 rounds the "
                  "output once"},
    [T_XENT_LOSS] = {"xent losses", CRIT_MAXREL, 1e-5, 2e-5,
                     "fp32 logsumexp over V terms; a device uses fast exp and another "
                     "summation order"},
    [T_XENT_DLOGITS] = {"xent dlogits", CRIT_MAXREL, 1e-5, 2e-2,
                        "softmax minus one-hot in fp32; bf16 rounds the output once"},
    [T_ADAMW] = {"adamw", CRIT_MAXREL, 1e-5, 1e-5,
                 "fp32 state and arithmetic on every backend: a few roundings, relative to "
                 "max|param| or max|update|"},
    [T_SUMSQ] = {"sum_squares", CRIT_MAXREL, 1e-12, 1e-12,
                 "accumulated in double (ops.h): order alone, ~n * 2^-53"},
    [T_ACCUM] = {"accumulate", CRIT_MAXREL, 1e-6, 1e-6,
                 "one fp32 addition per element: 2^-24 of the larger term"},
    [T_CPU_ACT] = {"vs cpu act", CRIT_L2, 1e-2, 1e-2,
                   "Llama-sized act outputs against the cpu's fp32 from the same bf16 inputs: "
                   "the output's rounding alone gives ~3e-3"},
    [T_CPU_F32] = {"vs cpu fp32", CRIT_L2, 1e-5, 1e-5,
                   "Llama-sized fp32 outputs (dweight, lse) from bf16 operands in another "
                   "summation order"},
    [T_CPU_ATT_BWD] = {"vs cpu attention dqkv", CRIT_L2, 2e-2, 2e-2,
                       "Llama-sized attention backward: P and dS rounded to bf16 before their "
                       "products"},
    [T_FP8_ACT] = {"matmul_fp8 act", CRIT_MAXREL, 1e-5, 2e-2,
                   "K-term sums of exact products of fp8 values (each fits fp32's mantissa) "
                   "in fp32, times two scales (fp32: ~1e-6); bf16 rounds the output once"},
    [T_FP8_F32] = {"matmul_fp8 fp32", CRIT_MAXREL, 1e-5, 1e-3,
                   "fp32 out (wgrad): as above; a Hopper FP8 tensor core keeps fewer bits "
                   "than fp32 between its promotions to fp32 (~2^-13 per partial sum)"},
    [T_NF4] = {"nf4_dequantize", CRIT_MAXREL, 0, 0,
               "one fp32 product level * absmax (double quant: one fp32 product and one sum "
               "make the absmax first), then the act dtype's one rounding: the reference does "
               "the same fp32 operations, so every backend gives its bits exactly"},
};
static double tol_of(tol_id id) {
    return ops->act_dtype == SHLM_BF16 ? tol_table[id].bf16 : tol_table[id].fp32;
}

/* ------------------------------------------------------------------------------------
 * random numbers (splitmix64), independent of the program's own rng */
static uint64_t rng_state;

static uint64_t rnd_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rnd_unif(void) { return (double)(rnd_u64() >> 11) * 0x1.0p-53; }
static double rnd_normal(void) {
    double u1 = 1.0 - rnd_unif(), u2 = rnd_unif();
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static int rnd_int(int n) { return (int)(rnd_u64() % (uint64_t)n); }

/* ------------------------------------------------------------------------------------
 * buffers: every host and backend buffer a test makes is remembered and released by
 * release_all() when the case ends, so the tests read as straight-line code */
enum { MAX_LIVE = 1024 };
static void *live_host[MAX_LIVE], *live_dev[MAX_LIVE];
static int n_live_host, n_live_dev;

static void *remember(void **list, int *n, void *p) {
    if (*n == MAX_LIVE) {
        fprintf(stderr, "test_ops: more than %d live buffers\n", MAX_LIVE);
        exit(1);
    }
    return list[(*n)++] = p;
}
static void release_all(void) {
    while (n_live_host) free(live_host[--n_live_host]);
    while (n_live_dev) ops->free(live_dev[--n_live_dev]);
}
/* untracked: for the references' own scratch, which they free themselves */
static void *calloc_or_die(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "test_ops: out of memory\n");
        exit(1);
    }
    return p;
}
static void *xcalloc(size_t n, size_t size) {
    return remember(live_host, &n_live_host, calloc_or_die(n, size));
}
static void *dalloc(size_t bytes) { return remember(live_dev, &n_live_dev, ops->alloc(bytes)); }
static float *hf(size_t n) { return xcalloc(n, sizeof(float)); }
static double *hd(size_t n) { return xcalloc(n, sizeof(double)); }
static double *hd_alloc_freq(int head_dim) { return hd((size_t)(head_dim / 2 + 1)); }

static float bf16_round(float x) { return shlm_bf16_to_f32(shlm_f32_to_bf16(x)); }

/* fp32 tensor ~ N(0, scale²) */
static float *rnd_f(size_t n, double scale) {
    float *a = hf(n);
    for (size_t i = 0; i < n; i++) a[i] = (float)(scale * rnd_normal());
    return a;
}
/* values made representable in the backend's act dtype, so that the reference sees
 * exactly what the backend sees */
static void act_round(float *a, size_t n) {
    if (ops->act_dtype == SHLM_BF16)
        for (size_t i = 0; i < n; i++) a[i] = bf16_round(a[i]);
}
static float *rnd_act(size_t n, double scale) {
    float *a = rnd_f(n, scale);
    act_round(a, n);
    return a;
}
static double *dup_d(const float *a, size_t n) {
    double *d = hd(n);
    for (size_t i = 0; i < n; i++) d[i] = a[i];
    return d;
}
static float *dup_f(const float *a, size_t n) {
    float *d = hf(n);
    memcpy(d, a, n * sizeof(float));
    return d;
}
static float *nan_f(size_t n) {
    float *a = hf(n);
    for (size_t i = 0; i < n; i++) a[i] = NAN;
    return a;
}

/* ------------------------------------------------------------------------------------
 * backend buffers: everything goes through the table, so any backend can run this */
static size_t act_bytes(size_t n) { return n * shlm_dtype_size(ops->act_dtype); }
/* element i of an act buffer */
static void *act_at(void *p, size_t i) { return (char *)p + act_bytes(i); }

static void *up_f32(const float *h, size_t n) {
    void *d = dalloc(n * sizeof(float));
    ops->to_device(d, h, n * sizeof(float));
    return d;
}
static void *up_i32(const int32_t *h, size_t n) {
    void *d = dalloc(n * sizeof(int32_t));
    ops->to_device(d, h, n * sizeof(int32_t));
    return d;
}
/* writes h (n fp32 values) into the act buffer d */
static void put_act(void *d, const float *h, size_t n) {
    if (ops->act_dtype == SHLM_F32) {
        ops->to_device(d, h, n * sizeof(float));
        return;
    }
    float *tmp = ops->alloc(n * sizeof(float));
    ops->to_device(tmp, h, n * sizeof(float));
    ops->f32_to_act(d, tmp, n);
    ops->sync();
    ops->free(tmp);
}
/* an act buffer holding h, starting `off` elements into its allocation (1: rows aligned
 * to one element only, as a tensor that starts mid-unit) */
static void *up_act_off(const float *h, size_t n, int off) {
    void *d = act_at(dalloc(act_bytes(n + (size_t)off)), (size_t)off);
    put_act(d, h, n);
    return d;
}
static void *up_act(const float *h, size_t n) { return up_act_off(h, n, 0); }
/* "=" outputs start as NaN: an element the op does not write fails its check */
static void *nan_act(size_t n) { return up_act(nan_f(n), n); }
static float *nan_f32_dev(size_t n) { return up_f32(nan_f(n), n); }

static void down_f32(float *h, const void *d, size_t n) {
    ops->sync();
    ops->to_host(h, d, n * sizeof(float));
}
static void down_act(float *h, const void *d, size_t n) {
    if (ops->act_dtype == SHLM_F32) {
        down_f32(h, d, n);
        return;
    }
    float *tmp = ops->alloc(n * sizeof(float));
    ops->bf16_to_f32(tmp, d, n); /* the only other act dtype */
    down_f32(h, tmp, n);
    ops->free(tmp);
}
static float *got_act(const void *d, size_t n) {
    float *h = hf(n);
    down_act(h, d, n);
    return h;
}
static float *got_f32(const void *d, size_t n) {
    float *h = hf(n);
    down_f32(h, d, n);
    return h;
}

/* ------------------------------------------------------------------------------------
 * checks */
static double max_abs(const double *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(b[i]));
    return m;
}
/* max_i |a_i - b_i| / scale (NaN when any a_i is NaN) */
static double max_err_over(const float *a, const double *b, size_t n, double scale) {
    double num = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) return NAN;
        if (d > num) num = d;
    }
    return num / (scale > 1e-30 ? scale : 1e-30);
}
static double max_rel_err(const float *a, const double *b, size_t n) {
    return max_err_over(a, b, n, max_abs(b, n));
}
static double rel_l2_err(const float *a, const double *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        if (isnan(d)) return NAN;
        num += d * d;
        den += b[i] * b[i];
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

static int report(const char *name, double err, tol_id id) {
    const double tol = tol_of(id);
    int ok = tol > 0 ? err < tol : err == 0.0; /* NaN fails both */
    return check(ok, "%-70s %s %.2e  tol %.0e %s", name,
                 tol_table[id].crit == CRIT_L2 ? "rel_l2" : "maxrel", err, tol, tol_table[id].name);
}

static int check_close(const char *name, const float *a, const double *b, size_t n, tol_id id) {
    double err = tol_table[id].crit == CRIT_L2 ? rel_l2_err(a, b, n) : max_rel_err(a, b, n);
    return report(name, err, id);
}

/* bit-identical float tensors; the printed error is their max relative difference */
static int check_same(const char *name, const float *a, const float *b, size_t n) {
    double *bd = dup_d(b, n);
    double err = memcmp(a, b, n * sizeof(float)) == 0 ? 0.0 : max_rel_err(a, bd, n);
    if (err == 0.0 && memcmp(a, b, n * sizeof(float)) != 0) err = 1e-300; /* e.g. -0 vs +0 */
    return report(name, err, T_BITS);
}

/* a yes/no property: printed as error 0 (holds) or 1 (does not) */
static int check_true(const char *name, int cond) { return report(name, cond ? 0.0 : 1.0, T_BITS); }

/* The reference gradient `grad` of loss() w.r.t. x (n elements) against central
 * differences at FD_COORDS random coordinates, relative to max|grad|. */
typedef double (*loss_fn)(void *ctx);
static void check_fd(const char *name, loss_fn loss, void *ctx, double *x, size_t n,
                     const double *grad) {
    double gmax = max_abs(grad, n), err = 0.0;
    for (int c = 0; c < FD_COORDS; c++) {
        size_t k = (size_t)(rnd_u64() % n);
        /* an absolute step: the error term h²·f'''/6 must not grow with |x| (logits
         * shifted by 1000); the divisor is the step actually taken */
        double x0 = x[k], xp = x0 + 1e-5, xm = x0 - 1e-5;
        x[k] = xp;
        double lp = loss(ctx);
        x[k] = xm;
        double lm = loss(ctx);
        x[k] = x0;
        err = fmax(err, fabs((lp - lm) / (xp - xm) - grad[k]));
    }
    char buf[160];
    snprintf(buf, sizeof buf, "fd reference %s", name);
    report(buf, err / (gmax > 1e-30 ? gmax : 1e-30), T_FD);
}

static double dot_d(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ====================================================================================
 * double-precision references: plain loops straight from the definitions */

static void ref_embedding_fwd(double *out, const int32_t *tok, const double *wte, int N, int C) {
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] = wte[(size_t)tok[i] * C + c];
}
static void ref_embedding_bwd(double *dwte, const double *dout, const int32_t *tok, int N, int C) {
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) dwte[(size_t)tok[i] * C + c] += dout[(size_t)i * C + c];
}

static void ref_rmsnorm_fwd(double *out, double *rstd, const double *x, const double *w, int N,
                            int C, double eps) {
    for (int i = 0; i < N; i++) {
        double ms = 0.0;
        for (int c = 0; c < C; c++) ms += x[(size_t)i * C + c] * x[(size_t)i * C + c];
        double r = 1.0 / sqrt(ms / C + eps);
        if (rstd) rstd[i] = r;
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] = x[(size_t)i * C + c] * r * w[c];
    }
}
/* dx += ; dw += */
static void ref_rmsnorm_bwd(double *dx, double *dw, const double *dout, const double *x,
                            const double *w, int N, int C, double eps) {
    for (int i = 0; i < N; i++) {
        const double *xi = x + (size_t)i * C, *gi = dout + (size_t)i * C;
        double ms = 0.0, m = 0.0;
        for (int c = 0; c < C; c++) ms += xi[c] * xi[c];
        ms /= C;
        double r = 1.0 / sqrt(ms + eps);
        for (int c = 0; c < C; c++) m += gi[c] * w[c] * xi[c];
        m /= C; /* mean of dout·w·x */
        for (int c = 0; c < C; c++) {
            dw[c] += gi[c] * xi[c] * r;
            dx[(size_t)i * C + c] += r * w[c] * gi[c] - r * r * r * xi[c] * m;
        }
    }
}

static void ref_matmul_fwd(double *out, const double *x, const double *w, int N, int C, int OC) {
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double s = 0.0;
            for (int c = 0; c < C; c++) s += x[(size_t)i * C + c] * w[(size_t)o * C + c];
            out[(size_t)i * OC + o] = s;
        }
}
/* dx += (if non-NULL); dw += (if non-NULL) */
static void ref_matmul_bwd(double *dx, double *dw, const double *dout, const double *x,
                           const double *w, int N, int C, int OC) {
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double g = dout[(size_t)i * OC + o];
            for (int c = 0; c < C; c++) {
                if (dx) dx[(size_t)i * C + c] += g * w[(size_t)o * C + c];
                if (dw) dw[(size_t)o * C + c] += g * x[(size_t)i * C + c];
            }
        }
}

/* out = x + bias on every row */
static void ref_bias_add(double *out, const double *x, const double *b, int N, int C) {
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] = x[(size_t)i * C + c] + b[c];
}
/* db += column sums of dout */
static void ref_bias_grad(double *db, const double *dout, int N, int C) {
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) db[c] += dout[(size_t)i * C + c];
}

/* default frequencies written out from the definition: pair i turns by theta^(-2i/hd)
 * radians per position (the kernels take them from kernels/rope_freq.h's description) */
static double *ref_rope_freq(int hd, double theta) {
    double *f = hd_alloc_freq(hd);
    for (int i = 0; i < hd / 2; i++) f[i] = exp(-(2.0 * i / hd) * log(theta));
    return f;
}
/* position of row r: r % T, after pos0[r / T] when given */
static int ref_rope_pos(int r, int T, const int32_t *pos0) {
    return (pos0 ? pos0[r / T] : 0) + r % T;
}
/* out = rope(x); elements outside the first n_heads heads are copied */
static void ref_rope_fwd(double *out, const double *x, int N, int T, int stride, int n_heads,
                         int hd, const double *freq, const int32_t *pos0) {
    int half = hd / 2;
    memcpy(out, x, (size_t)N * stride * sizeof(double));
    for (int r = 0; r < N; r++)
        for (int h = 0; h < n_heads; h++)
            for (int i = 0; i < half; i++) {
                size_t a = (size_t)r * stride + (size_t)h * hd + i, b = a + half;
                double th = ref_rope_pos(r, T, pos0) * freq[i];
                out[a] = x[a] * cos(th) - x[b] * sin(th);
                out[b] = x[b] * cos(th) + x[a] * sin(th);
            }
}
/* dx = Jᵀ dout, the transpose of the forward's 2×2 blocks */
static void ref_rope_bwd(double *dx, const double *dout, int N, int T, int stride, int n_heads,
                         int hd, const double *freq, const int32_t *pos0) {
    int half = hd / 2;
    memcpy(dx, dout, (size_t)N * stride * sizeof(double));
    for (int r = 0; r < N; r++)
        for (int h = 0; h < n_heads; h++)
            for (int i = 0; i < half; i++) {
                size_t a = (size_t)r * stride + (size_t)h * hd + i, b = a + half;
                double th = ref_rope_pos(r, T, pos0) * freq[i];
                dx[a] = dout[a] * cos(th) + dout[b] * sin(th);
                dx[b] = -dout[a] * sin(th) + dout[b] * cos(th);
            }
}

typedef struct attn_shape {
    int B, T, nh, nkv, hd;
} attn_shape;

/* element d of query head h / key head kh / value head kh of token (b,t) in qkv */
#define QI(s, b, t, h, d)                                                                          \
    ((size_t)((b) * (s).T + (t)) * ((s).nh + 2 * (s).nkv) * (s).hd + (size_t)(h) * (s).hd + (d))
#define KI(s, b, t, kh, d) QI(s, b, t, (s).nh + (kh), d)
#define VI(s, b, t, kh, d) QI(s, b, t, (s).nh + (s).nkv + (kh), d)
#define OI(s, b, t, h, d)                                                                          \
    ((size_t)((b) * (s).T + (t)) * (s).nh * (s).hd + (size_t)(h) * (s).hd + (d))

/* The reference's mask, written out rather than as the kernels' lower bound: query i of
 * sequence b sees key j when j <= i and both belong to the same document, i.e. share their
 * first token (doc NULL: one document per sequence). */
static int ref_sees(const int32_t *doc, attn_shape s, int b, int i, int j) {
    return j <= i && (!doc || doc[(size_t)b * s.T + i] == doc[(size_t)b * s.T + j]);
}

/* P (T,T) of (b,h): softmax of the scaled scores under ref_sees; fills lse if non-NULL */
static void ref_attn_probs(double *P, double *lse_row, const double *qkv, const int32_t *doc,
                           attn_shape s, int b, int h) {
    int kh = h / (s.nh / s.nkv);
    double sc = 1.0 / sqrt((double)s.hd);
    for (int i = 0; i < s.T; i++) {
        double m = -INFINITY, z = 0.0;
        for (int j = 0; j < s.T; j++) {
            const int seen = ref_sees(doc, s, b, i, j);
            double v = 0.0;
            if (seen)
                for (int d = 0; d < s.hd; d++)
                    v += qkv[QI(s, b, i, h, d)] * qkv[KI(s, b, j, kh, d)];
            P[(size_t)i * s.T + j] = seen ? v * sc : -INFINITY;
            if (seen && v * sc > m) m = v * sc;
        }
        for (int j = 0; j < s.T; j++)
            if (ref_sees(doc, s, b, i, j)) z += exp(P[(size_t)i * s.T + j] - m);
        double l = m + log(z);
        for (int j = 0; j < s.T; j++)
            P[(size_t)i * s.T + j] = ref_sees(doc, s, b, i, j) ? exp(P[(size_t)i * s.T + j] - l) : 0.0;
        if (lse_row) lse_row[i] = l;
    }
}
static void ref_attention_fwd(double *out, double *lse, const double *qkv, const int32_t *doc,
                              attn_shape s) {
    double *P = calloc_or_die((size_t)s.T * s.T, sizeof(double));
    int g = s.nh / s.nkv;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.nh; h++) {
            ref_attn_probs(P, lse ? lse + ((size_t)b * s.nh + h) * s.T : NULL, qkv, doc, s, b, h);
            for (int i = 0; i < s.T; i++)
                for (int d = 0; d < s.hd; d++) {
                    double acc = 0.0;
                    for (int j = 0; j <= i; j++)
                        acc += P[(size_t)i * s.T + j] * qkv[VI(s, b, j, h / g, d)];
                    out[OI(s, b, i, h, d)] = acc;
                }
        }
    free(P);
}
/* dqkv = (overwritten): dV = Pᵀ dO, dP = dO Vᵀ, dS = P ⊙ (dP − rowsum(P ⊙ dP)),
 * dQ = dS K / √hd, dK = dSᵀ Q / √hd; kv heads sum over their query heads */
static void ref_attention_bwd(double *dqkv, const double *dout, const double *qkv,
                              const int32_t *doc, attn_shape s) {
    size_t n = (size_t)s.B * s.T * (s.nh + 2 * s.nkv) * s.hd;
    memset(dqkv, 0, n * sizeof(double));
    double *P = calloc_or_die((size_t)s.T * s.T, sizeof(double));
    double *dP = calloc_or_die((size_t)s.T * s.T, sizeof(double));
    double sc = 1.0 / sqrt((double)s.hd);
    int g = s.nh / s.nkv;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.nh; h++) {
            int kh = h / g;
            ref_attn_probs(P, NULL, qkv, doc, s, b, h);
            for (int i = 0; i < s.T; i++)
                for (int j = 0; j <= i; j++) {
                    double v = 0.0;
                    for (int d = 0; d < s.hd; d++)
                        v += dout[OI(s, b, i, h, d)] * qkv[VI(s, b, j, kh, d)];
                    dP[(size_t)i * s.T + j] = v;
                }
            for (int i = 0; i < s.T; i++) {
                double rs = 0.0;
                for (int j = 0; j <= i; j++)
                    rs += P[(size_t)i * s.T + j] * dP[(size_t)i * s.T + j];
                for (int j = 0; j <= i; j++) {
                    double p = P[(size_t)i * s.T + j], dS = p * (dP[(size_t)i * s.T + j] - rs);
                    if (p == 0.0) continue; /* masked (or underflowed): adds nothing */
                    for (int d = 0; d < s.hd; d++) {
                        dqkv[QI(s, b, i, h, d)] += sc * dS * qkv[KI(s, b, j, kh, d)];
                        dqkv[KI(s, b, j, kh, d)] += sc * dS * qkv[QI(s, b, i, h, d)];
                        dqkv[VI(s, b, j, kh, d)] += p * dout[OI(s, b, i, h, d)];
                    }
                }
            }
        }
    free(P);
    free(dP);
}

static double ref_silu(double g) { return g / (1.0 + exp(-g)); }
static void ref_swiglu_fwd(double *out, const double *gu, int N, int F) {
    for (int i = 0; i < N; i++)
        for (int j = 0; j < F; j++)
            out[(size_t)i * F + j] =
                ref_silu(gu[(size_t)i * 2 * F + j]) * gu[(size_t)i * 2 * F + F + j];
}
static void ref_swiglu_bwd(double *dgu, const double *dout, const double *gu, int N, int F) {
    for (int i = 0; i < N; i++)
        for (int j = 0; j < F; j++) {
            double g = gu[(size_t)i * 2 * F + j], u = gu[(size_t)i * 2 * F + F + j];
            double sg = 1.0 / (1.0 + exp(-g)), dy = dout[(size_t)i * F + j];
            dgu[(size_t)i * 2 * F + j] = dy * u * (sg + g * sg * (1.0 - sg));
            dgu[(size_t)i * 2 * F + F + j] = dy * ref_silu(g);
        }
}

/* losses(N) and, if dlogits, (softmax − onehot)·dscale; ignored rows (target < 0) give 0 */
static void ref_xent(double *losses, double *dlogits, const double *x, const int32_t *tgt, int N,
                     int V, double dscale) {
    for (int i = 0; i < N; i++) {
        const double *xi = x + (size_t)i * V;
        if (tgt[i] < 0) {
            losses[i] = 0.0;
            if (dlogits)
                for (int j = 0; j < V; j++) dlogits[(size_t)i * V + j] = 0.0;
            continue;
        }
        double m = xi[0], z = 0.0;
        for (int j = 1; j < V; j++) m = fmax(m, xi[j]);
        for (int j = 0; j < V; j++) z += exp(xi[j] - m);
        losses[i] = m + log(z) - xi[tgt[i]];
        if (dlogits)
            for (int j = 0; j < V; j++)
                dlogits[(size_t)i * V + j] = (exp(xi[j] - m) / z - (j == tgt[i])) * dscale;
    }
}

/* one AdamW step in double, decoupled decay on the pre-step weight */
static void ref_adamw(double *p, const double *grad, double *m, double *v, size_t n, double lr,
                      double b1, double b2, double eps, double wd, double gscale, int step) {
    double c1 = 1.0 - pow(b1, step), c2 = 1.0 - pow(b2, step);
    for (size_t i = 0; i < n; i++) {
        double g = grad[i] * gscale;
        m[i] = b1 * m[i] + (1.0 - b1) * g;
        v[i] = b2 * v[i] + (1.0 - b2) * g * g;
        p[i] = p[i] - lr * ((m[i] / c1) / (sqrt(v[i] / c2) + eps) + wd * p[i]);
    }
}

/* ====================================================================================
 * the tests */

static void test_backends(void) {
    check_true("backends: shlm_ops_find(name) finds this backend", shlm_ops_find(ops->name) == ops);
    check_true("backends: shlm_ops_find(\"cpu\") is shlm_ops_cpu",
               shlm_ops_find("cpu") == &shlm_ops_cpu);
    check_true("backends: unknown name gives NULL", shlm_ops_find("no-such-backend") == NULL);
    int n = 0, has_cpu = 0, distinct = 1;
    for (; shlm_backends[n]; n++) {
        has_cpu |= shlm_backends[n] == &shlm_ops_cpu;
        for (int k = 0; k < n; k++)
            distinct &= strcmp(shlm_backends[k]->name, shlm_backends[n]->name) != 0;
    }
    check_true("backends: list holds cpu, names distinct, NULL-terminated",
               has_cpu && distinct && n < 16);
    check_true("backends: dtype names fp32 / bf16",
               strcmp(shlm_dtype_name(SHLM_F32), "fp32") == 0 &&
                   strcmp(shlm_dtype_name(SHLM_BF16), "bf16") == 0);
    int all = ops->name && ops->available && ops->alloc && ops->free && ops->zero && ops->copy &&
              ops->to_device && ops->to_host && ops->sync && ops->f32_to_act &&
              ops->round_to_bf16 && ops->embedding_fwd && ops->embedding_bwd && ops->rmsnorm_fwd &&
              ops->rmsnorm_bwd && ops->matmul_fwd && ops->matmul_bwd && ops->rope &&
              ops->attention_fwd && ops->attention_bwd && ops->kv_append &&
              ops->attention_decode && ops->swiglu_fwd && ops->swiglu_bwd &&
              ops->xent_fwd_bwd && ops->adamw && ops->sum_squares &&
              ops->f32_to_bf16 && ops->bf16_to_f32 && ops->accumulate && ops->nf4_dequantize;
    check_true("backends: every member of the table is set", all);
    check_true("backends: available() is 1", ops->available() == 1);
    if (is_cpu) check_true("backends: cpu act dtype is fp32", ops->act_dtype == SHLM_F32);
}

static void test_memory(void) {
    const size_t sizes[] = {0, 1, 3, 64, 1000, 1003, 1u << 20};
    int zeroed = 1, aligned = 1, roundtrip = 1, zero_ok = 1, part_ok = 1;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        unsigned char *h = xcalloc(n, 1), *h2 = xcalloc(n, 1);
        /* dirty a block of this size and free it first, so that the allocator has
         * non-zero memory to hand back and "zero-filled" is really tested */
        unsigned char *dirt = xcalloc(n, 1);
        memset(dirt, 0xA5, n);
        for (int r = 0; r < 2; r++) {
            void *t = ops->alloc(n);
            ops->to_device(t, dirt, n);
            ops->sync();
            ops->free(t);
        }
        void *d = ops->alloc(n), *d2 = ops->alloc(n);
        if (d == NULL || d2 == NULL) zeroed = 0;
        if (is_cpu) aligned &= ((uintptr_t)d % 64 == 0) && ((uintptr_t)d2 % 64 == 0);
        memset(h, 0xA5, n);
        ops->sync();
        ops->to_host(h, d, n);
        for (size_t i = 0; i < n; i++) zeroed &= h[i] == 0;
        for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(rnd_u64() >> 56);
        ops->to_device(d, h, n);
        ops->copy(d2, d, n);
        ops->sync();
        ops->to_host(h2, d2, n);
        roundtrip &= n == 0 || memcmp(h, h2, n) == 0;
        if (n > 110) { /* zero of a range inside a buffer leaves its neighbours alone */
            ops->zero((char *)d2 + 10, 100);
            ops->sync();
            ops->to_host(h2, d2, n);
            memset(h + 10, 0, 100);
            part_ok &= memcmp(h, h2, n) == 0;
        }
        ops->zero(d2, n);
        ops->sync();
        ops->to_host(h2, d2, n);
        for (size_t i = 0; i < n; i++) zero_ok &= h2[i] == 0;
        ops->free(d);
        ops->free(d2);
    }
    ops->free(NULL);
    check_true("memory: alloc returns zero-filled memory (0 B .. 1 MiB)", zeroed);
    if (is_cpu) check_true("memory: cpu alloc is 64-byte aligned", aligned);
    check_true("memory: to_device, copy, to_host round trip", roundtrip);
    check_true("memory: zero of a range inside a buffer, neighbours kept", part_ok);
    check_true("memory: zero", zero_ok);
    if (is_cpu) { /* an in-place all-gather copies a shard onto itself */
        float a[5] = {1, 2, 3, 4, 5}, b[5] = {1, 2, 3, 4, 5};
        ops->copy(a, a, sizeof a);
        check_same("memory: cpu copy with dst == src is the identity", a, b, 5);
    }
}

static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
/* |value| of a finite fp32 bit pattern, decoded from its fields; exponent 255 with a
 * zero mantissa decodes to 2^128, the overflow threshold IEEE rounding compares with */
static double field_value(uint32_t u) {
    int e = (int)((u >> 23) & 0xFF);
    uint32_t m = u & 0x7FFFFF;
    return e == 0 ? ldexp((double)m, -149) : ldexp(1.0 + m / 8388608.0, e - 127);
}
/* round-to-nearest-even from the definition: the nearer of the two neighbouring bf16
 * values, on a tie the one with an even last mantissa bit */
static uint16_t ref_bf16(uint32_t u) {
    uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
    if ((u & 0x7FFFFFFFu) >= 0x7F800000u) return (uint16_t)(u >> 16); /* ±inf (NaN: unused) */
    double x = field_value(u), dl = x - field_value(lo), dh = field_value(hi) - x;
    if (dl < dh) return (uint16_t)(lo >> 16);
    if (dh < dl) return (uint16_t)(hi >> 16);
    return (lo >> 16) & 1 ? (uint16_t)(hi >> 16) : (uint16_t)(lo >> 16);
}
static int bf16_is_nan(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0; }

/* the host's scalar conversion (shlm_f32_to_bf16) against the definition */
static void test_convert_scalar(void) {
    /* hand-picked patterns: ties go to the even neighbour; overflow rounds to inf */
    static const struct {
        uint32_t in;
        uint16_t want;
    } cases[] = {
        {0x3F800000u, 0x3F80}, /* 1.0 exact */
        {0x3F808000u, 0x3F80}, /* tie, kept bit even: down */
        {0x3F818000u, 0x3F82}, /* tie, kept bit odd: up */
        {0x3F808001u, 0x3F81}, /* just above the tie */
        {0x3F807FFFu, 0x3F80}, /* just below the tie */
        {0xBF818000u, 0xBF82}, /* negative tie, odd: away from zero */
        {0xBF808000u, 0xBF80}, /* negative tie, even */
        {0x3FFF8000u, 0x4000}, /* tie that carries into the exponent */
        {0x00008000u, 0x0000}, /* subnormal tie, even */
        {0x00018000u, 0x0002}, /* subnormal tie, odd */
        {0x80000000u, 0x8000}, /* -0 */
        {0x7F7F7FFFu, 0x7F7F}, /* largest value that stays finite */
        {0x7F7F8000u, 0x7F80}, /* tie at the top: to even = inf */
        {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX rounds to inf */
        {0x7F800000u, 0x7F80}, /* +inf */
        {0xFF800000u, 0xFF80}, /* -inf */
    };
    int bad = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint16_t got = shlm_f32_to_bf16(bits_f32(cases[k].in));
        if (got != cases[k].want) {
            printf("     f32 0x%08" PRIX32 " -> bf16 0x%04X, want 0x%04X\n", cases[k].in, got,
                   cases[k].want);
            bad++;
        }
        if (ref_bf16(cases[k].in) != cases[k].want) {
            printf("     (test's own reference is wrong at 0x%08" PRIX32 ")\n", cases[k].in);
            bad++;
        }
    }
    check_true("bf16: ties-to-even, carries, subnormals, overflow, inf", bad == 0);

    /* NaN stays NaN (signalling ones with only low payload bits included), sign kept */
    static const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u,
                                    0xFF800001u, 0x7FFFFFFFu, 0x7F80FFFFu};
    bad = 0;
    for (size_t k = 0; k < sizeof nans / sizeof nans[0]; k++) {
        uint16_t b = shlm_f32_to_bf16(bits_f32(nans[k]));
        bad += !bf16_is_nan(b) || (b >> 15) != (nans[k] >> 31);
    }
    check_true("bf16: NaN stays NaN of the same sign", bad == 0);

    /* random bit patterns (every exponent) against the definition */
    bad = 0;
    for (int k = 0; k < (1 << 20); k++) {
        uint32_t u = (uint32_t)rnd_u64();
        if (k % 4 == 0) u = (u & 0xFFFF0000u) | 0x8000u; /* many exact ties */
        uint16_t got = shlm_f32_to_bf16(bits_f32(u));
        int nan_in = (u & 0x7FFFFFFFu) > 0x7F800000u;
        bad += nan_in ? !bf16_is_nan(got) : got != ref_bf16(u);
    }
    check_true("bf16: 2^20 random patterns match round-to-nearest-even", bad == 0);

    /* bf16 -> f32 is exact: every pattern decodes to its value and rounds back to itself */
    bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float x = shlm_bf16_to_f32((uint16_t)b);
        if (bf16_is_nan((uint16_t)b)) {
            bad += !isnan(x);
            continue;
        }
        double want = field_value(b << 16) * ((b >> 15) ? -1.0 : 1.0);
        if ((b & 0x7FFF) == 0x7F80) want = (b >> 15) ? -INFINITY : INFINITY;
        bad += (double)x != want || shlm_f32_to_bf16(x) != b;
    }
    check_true("bf16: all 65536 bf16 values decode exactly and round-trip", bad == 0);
}

/* The backend's conversions on n elements starting `off` elements into their buffers,
 * against the scalar conversion, bit for bit (NaN payloads included): f32_to_act,
 * f32_to_bf16, bf16_to_f32, round_to_bf16. x: n + 1 fp32 values. */
static void convert_case(const float *x, size_t n, int off) {
    char tag[64], name[128];
    snprintf(tag, sizeof tag, "(n=%zu%s)", n, off ? ", unaligned" : "");
    const float *xs = x + off;
    float *want_round = hf(n);
    uint16_t *want_bits = xcalloc(n, sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        want_bits[i] = shlm_f32_to_bf16(xs[i]);
        want_round[i] = shlm_bf16_to_f32(want_bits[i]);
    }
    float *d = up_f32(x, n + 1);
    uint16_t *bits = dalloc((n + 1) * sizeof(uint16_t)), *hbits = xcalloc(n, sizeof(uint16_t));
    ops->f32_to_bf16(bits + off, d + off, n);
    ops->sync();
    ops->to_host(hbits, bits + off, n * sizeof(uint16_t));
    snprintf(name, sizeof name, "bf16: f32_to_bf16 == scalar conversion %s", tag);
    check_true(name, memcmp(hbits, want_bits, n * sizeof(uint16_t)) == 0);

    float *back = up_f32(nan_f(n + 1), n + 1), *got = hf(n);
    ops->bf16_to_f32(back + off, bits + off, n);
    down_f32(got, back + off, n);
    snprintf(name, sizeof name, "bf16: bf16_to_f32(f32_to_bf16(x)) %s", tag);
    check_true(name, memcmp(got, want_round, n * sizeof(float)) == 0);

    /* f32 -> act: a copy for fp32 activations, the bf16 conversion otherwise */
    void *act = dalloc(act_bytes(n + 1));
    ops->f32_to_act(act_at(act, off), d + off, n);
    ops->sync();
    if (ops->act_dtype == SHLM_BF16) {
        ops->to_host(hbits, act_at(act, off), n * sizeof(uint16_t));
        snprintf(name, sizeof name, "convert: f32_to_act bits %s", tag);
        check_true(name, memcmp(hbits, want_bits, n * sizeof(uint16_t)) == 0);
    } else {
        ops->to_host(got, act_at(act, off), n * sizeof(float));
        snprintf(name, sizeof name, "convert: f32_to_act is a copy %s", tag);
        check_true(name, memcmp(got, xs, n * sizeof(float)) == 0);
    }

    ops->round_to_bf16(d + off, n);
    down_f32(got, d + off, n);
    snprintf(name, sizeof name, "bf16: round_to_bf16 == bf16_to_f32(f32_to_bf16(x)) %s", tag);
    check_true(name, memcmp(got, want_round, n * sizeof(float)) == 0);
}

static void test_convert(void) {
    test_convert_scalar();
    /* every special case of the rounding, then random bit patterns: every exponent, NaN
     * payloads included; the offset of one element takes the unaligned paths */
    const size_t n = 10007;
    const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f /* tie: to even */,
                              1.01171875f /* tie: up */, 3.4028235e38f /* rounds to inf */,
                              -3.4028235e38f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, 1.4e-45f,
                              3.14159265f, 65504.0f, 1e30f, -2.5e-20f, bits_f32(0x3F808000u),
                              bits_f32(0x3F818000u), bits_f32(0x7F7FFFFFu)};
    const size_t ns = sizeof specials / sizeof specials[0];
    float *x = hf(n + 1);
    for (size_t i = 0; i <= n; i++) x[i] = i < ns ? specials[i] : bits_f32((uint32_t)rnd_u64());
    convert_case(x, n, 0);
    convert_case(x, n, 1);
    float *one = hf(2);
    one[0] = one[1] = bits_f32(0x3F818000u);
    convert_case(one, 1, 0); /* a single element */
    convert_case(one, 1, 1);
    float nanv = NAN, *got = hf(1);
    float *d = up_f32(&nanv, 1);
    ops->round_to_bf16(d, 1);
    down_f32(got, d, 1);
    check_true("bf16: round_to_bf16 keeps NaN", isnan(got[0]));
    if (!is_cpu && !small_only) {
        /* a size where every thread of a device's grid-stride loop takes several elements */
        const size_t nb = 40000003;
        float *xb = hf(nb + 1);
        for (size_t i = 0; i <= nb; i++) xb[i] = bits_f32((uint32_t)rnd_u64());
        convert_case(xb, nb, 0);
    }
}

/* ---- embedding ---- */
typedef struct emb_ctx {
    double *wte, *dout, *out;
    const int32_t *tok;
    int N, C;
} emb_ctx;
static double emb_loss(void *p) {
    emb_ctx *c = p;
    ref_embedding_fwd(c->out, c->tok, c->wte, c->N, c->C);
    return dot_d(c->out, c->dout, (size_t)c->N * c->C);
}

static void embedding_case(int N, int C, int V, int with_fd) {
    char tag[64], name[160];
    snprintf(tag, sizeof tag, "(N=%d C=%d V=%d)", N, C, V);
    const size_t nw = (size_t)V * C, no = (size_t)N * C;
    int32_t *tok = xcalloc(N, sizeof(int32_t));
    for (int i = 0; i < N; i++) tok[i] = rnd_int(V);
    tok[0] = tok[N - 1] = V - 1; /* the last row of wte, repeated */
    float *wte = rnd_act(nw, 1.0), *dout = rnd_act(no, 1.0), *dwte0 = rnd_f(nw, 1.0);
    double *ref = hd(no), *dref = dup_d(dwte0, nw);
    emb_ctx c = {dup_d(wte, nw), dup_d(dout, no), ref, tok, N, C};

    void *d_tok = up_i32(tok, N), *d_wte = up_act(wte, nw), *d_out = nan_act(no);
    void *d_dout = up_act(dout, no);
    float *d_dwte = up_f32(dwte0, nw);
    ops->embedding_fwd(d_out, d_tok, d_wte, N, C);
    ref_embedding_fwd(ref, tok, c.wte, N, C);
    snprintf(name, sizeof name, "embedding_fwd out (=) %s", tag);
    check_close(name, got_act(d_out, no), ref, no, T_BITS);

    ops->embedding_bwd(d_dwte, d_dout, d_tok, N, C);
    ref_embedding_bwd(dref, c.dout, tok, N, C);
    float *got = got_f32(d_dwte, nw);
    snprintf(name, sizeof name, "embedding_bwd dwte (+=, repeated tokens) %s", tag);
    check_close(name, got, dref, nw, T_EMB_BWD);
    if (!is_cpu) { /* the same fp32 additions in the same (token) order as the cpu */
        float *want = dup_f(dwte0, nw);
        cpu->embedding_bwd(want, dout, tok, N, C);
        snprintf(name, sizeof name, "embedding_bwd dwte == cpu's %s", tag);
        check_same(name, got, want, nw);
    }
    if (with_fd) {
        double *g = hd(nw);
        ref_embedding_bwd(g, c.dout, tok, N, C);
        check_fd("embedding dwte", emb_loss, &c, c.wte, nw, g);
    }
    release_all();
}

static void test_embedding(void) {
    embedding_case(91, 37, 17, 1); /* V < N: tokens repeat, as the scatter must handle */
    embedding_case(1, 1, 1, 0);
    embedding_case(5, 2, 3, 0);
    embedding_case(517, 200, 97, 0);
    embedding_case(300, 75, 50, 0);
    if (!is_cpu && !small_only) embedding_case(2048, 4096, 32000, 0);
}

/* ---- rmsnorm ---- */
typedef struct rms_ctx {
    double *x, *w, *dout, *out;
    int N, C;
    double eps;
} rms_ctx;
static double rms_loss(void *p) {
    rms_ctx *c = p;
    ref_rmsnorm_fwd(c->out, NULL, c->x, c->w, c->N, c->C, c->eps);
    return dot_d(c->out, c->dout, (size_t)c->N * c->C);
}

/* The producer's amax (ops.h rmsnorm_fwd's amax): run(amax) writes out (n act values)
 * again; from 0 the amax is max |out| of what it wrote, bit for bit; from a start above that
 * it stays the start (a maximum with what is there). */
static void producer_amax_check(const char *what, void (*run)(void *ctx, float *amax), void *ctx,
                                const void *d_out, size_t n) {
    char name[200];
    float zero = 0.0f;
    float *d_amax = up_f32(&zero, 1);
    run(ctx, d_amax);
    const float *out = got_act(d_out, n);
    float want = 0.0f;
    for (size_t i = 0; i < n; i++) want = fmaxf(want, fabsf(out[i])); /* NaN ignored */
    float got;
    down_f32(&got, d_amax, 1);
    snprintf(name, sizeof name, "%s amax == max |out| of the values written, bit for bit", what);
    check_true(name, memcmp(&got, &want, sizeof got) == 0);
    const float start = 2.0f * want + 1.0f;
    ops->to_device(d_amax, &start, sizeof start);
    run(ctx, d_amax);
    down_f32(&got, d_amax, 1);
    snprintf(name, sizeof name, "%s amax from a larger start stays the start", what);
    check_true(name, got == start);
}

typedef struct producer_ctx {
    void *out, *rstd;
    const void *inp, *w, *dout;
    int N, C;
} producer_ctx;
static void run_rmsnorm_amax(void *ctx, float *amax) {
    const producer_ctx *p = ctx;
    ops->rmsnorm_fwd(p->out, p->rstd, p->inp, p->w, p->N, p->C, 1e-5f, amax);
}
static void run_swiglu_fwd_amax(void *ctx, float *amax) {
    const producer_ctx *p = ctx;
    ops->swiglu_fwd(p->out, p->inp, p->N, p->C, amax);
}
static void run_swiglu_bwd_amax(void *ctx, float *amax) {
    const producer_ctx *p = ctx;
    ops->swiglu_bwd(p->out, p->dout, p->inp, p->N, p->C, amax);
}

static void rmsnorm_case(int N, int C, int with_fd) {
    char tag[64], name[160];
    snprintf(tag, sizeof tag, "(N=%d C=%d)", N, C);
    const float eps = 1e-5f;
    const size_t n = (size_t)N * C;
    float *x = rnd_act(n, 1.0), *w = rnd_f(C, 0.3), *dout = rnd_act(n, 1.0);
    for (int c = 0; c < C; c++) w[c] += 1.0f;
    act_round(w, C);
    /* one row small enough that eps matters (mean square ~1e-6 against eps 1e-5) */
    if (N > 3)
        for (int c = 0; c < C; c++) x[3 * C + c] = (float)(x[3 * C + c] * 1e-3);
    act_round(x, n);
    float *dx0 = rnd_act(n, 1.0), *dw0 = rnd_f(C, 1.0);
    double *ref = hd(n), *rstd = hd(N), *rdx = dup_d(dx0, n), *rdw = dup_d(dw0, C);
    rms_ctx c = {dup_d(x, n), dup_d(w, C), dup_d(dout, n), hd(n), N, C, eps};

    void *d_x = up_act(x, n), *d_w = up_act(w, C), *d_dout = up_act(dout, n);
    void *d_out = nan_act(n), *d_dx = up_act(dx0, n);
    float *d_rstd = nan_f32_dev(N), *d_dw = up_f32(dw0, C);

    ops->rmsnorm_fwd(d_out, d_rstd, d_x, d_w, N, C, eps, NULL);
    ref_rmsnorm_fwd(ref, rstd, c.x, c.w, N, C, eps);
    snprintf(name, sizeof name, "rmsnorm_fwd out (=) %s", tag);
    check_close(name, got_act(d_out, n), ref, n, T_RMS_ACT);
    snprintf(name, sizeof name, "rmsnorm_fwd rstd %s", tag);
    check_close(name, got_f32(d_rstd, N), rstd, N, T_RMS_F32);
    {
        producer_ctx pc = {d_out, d_rstd, d_x, d_w, NULL, N, C};
        snprintf(name, sizeof name, "rmsnorm_fwd %s", tag);
        producer_amax_check(name, run_rmsnorm_amax, &pc, d_out, n);
    }

    ops->rmsnorm_bwd(d_dx, d_dw, d_dout, d_x, d_w, d_rstd, N, C);
    ref_rmsnorm_bwd(rdx, rdw, c.dout, c.x, c.w, N, C, eps);
    snprintf(name, sizeof name, "rmsnorm_bwd dinp (+=) %s", tag);
    check_close(name, got_act(d_dx, n), rdx, n, T_RMS_ACT);
    snprintf(name, sizeof name, "rmsnorm_bwd dweight (+=) %s", tag);
    check_close(name, got_f32(d_dw, C), rdw, C, T_RMS_F32);

    if (with_fd) {
        double *gx = hd(n), *gw = hd(C);
        ref_rmsnorm_bwd(gx, gw, c.dout, c.x, c.w, N, C, eps);
        check_fd("rmsnorm dinp", rms_loss, &c, c.x, n, gx);
        check_fd("rmsnorm dweight", rms_loss, &c, c.w, C, gw);
    }
    if (is_cpu) { /* documented in cpu.h: dinp may alias dout */
        float *buf = dup_f(dout, n), *dw = dup_f(dw0, C);
        double *want = hd(n), *wdw = dup_d(dw0, C);
        for (size_t i = 0; i < n; i++) want[i] = dout[i];
        ref_rmsnorm_bwd(want, wdw, c.dout, c.x, c.w, N, C, eps);
        ops->rmsnorm_bwd(buf, dw, buf, x, w, d_rstd, N, C);
        snprintf(name, sizeof name, "rmsnorm_bwd cpu: dinp aliasing dout %s", tag);
        check_close(name, buf, want, n, T_RMS_ACT);
    }
    release_all();
}

static void test_rmsnorm(void) {
    rmsnorm_case(91, 37, 1);
    rmsnorm_case(1, 1, 0);
    rmsnorm_case(3, 2, 0);
    rmsnorm_case(37, 129, 0);
    rmsnorm_case(64, 256, 0);
    if (!is_cpu && !small_only) {
        rmsnorm_case(1024, 4096, 0);
        rmsnorm_case(300, 2048, 0); /* the cuda register kernels: 256 threads, 1 group each */
        rmsnorm_case(257, 5120, 0); /* 320 threads, 2 groups each */
        rmsnorm_case(600, 8192, 0); /* 512 threads, 2 groups each */
    }
}

/* ---- matmul ---- */
typedef struct mm_ctx {
    double *x, *w, *dout, *out;
    int N, C, OC;
} mm_ctx;
static double mm_loss(void *p) {
    mm_ctx *c = p;
    ref_matmul_fwd(c->out, c->x, c->w, c->N, c->C, c->OC);
    return dot_d(c->out, c->dout, (size_t)c->N * c->OC);
}

/* out[i] = a[i] + b[i] (b NULL: a copy) */
static double *sum_d(const double *a, const double *b, size_t n) {
    double *out = hd(n);
    for (size_t i = 0; i < n; i++) out[i] = a[i] + (b ? b[i] : 0.0);
    return out;
}
static double *from_f(const float *a, size_t n) { return dup_d(a, n); }

/* One shape. off: element offset of every operand (1: act rows aligned to one element).
 * by_cpu: the expected products come from the cpu backend (Llama-sized shapes, checked by
 * relative L2) instead of the double reference. Every variant of ops.h's contract: no
 * residual, a separate one, one aliasing out; backward +=, each output alone, "=" flags. */
static void matmul_case(int N, int C, int OC, int off, int by_cpu, int with_fd) {
    char tag[64], name[160];
    snprintf(tag, sizeof tag, "(N=%d C=%d OC=%d%s%s)", N, C, OC, off ? ", unaligned" : "",
             by_cpu ? ", vs cpu" : "");
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    const tol_id t_act = by_cpu ? T_CPU_ACT : T_MM_ACT, t_dw = by_cpu ? T_CPU_F32 : T_MM_DW;
    float *x = rnd_act(nx, 1.0), *w = rnd_act(nw, by_cpu ? 0.05 : 0.2), *dout = rnd_act(ny, 1.0);
    float *y0 = rnd_act(ny, 1.0), *dx0 = rnd_act(nx, 1.0), *dw0 = rnd_f(nw, 1.0);
    mm_ctx c = {dup_d(x, nx), dup_d(w, nw), dup_d(dout, ny), hd(ny), N, C, OC};
    /* the products: y = x·wᵀ, dx = dout·w, dw = doutᵀ·x */
    double *py, *pdx, *pdw;
    if (by_cpu) {
        float *fy = hf(ny), *fdx = hf(nx), *fdw = hf(nw);
        cpu->matmul_fwd(fy, x, w, N, C, OC, NULL);
        cpu->matmul_bwd(fdx, fdw, dout, x, w, N, C, OC, SHLM_MM_SET_DINP | SHLM_MM_SET_DWEIGHT);
        py = from_f(fy, ny), pdx = from_f(fdx, nx), pdw = from_f(fdw, nw);
    } else {
        py = hd(ny), pdx = hd(nx), pdw = hd(nw);
        ref_matmul_fwd(py, c.x, c.w, N, C, OC);
        ref_matmul_bwd(pdx, pdw, c.dout, c.x, c.w, N, C, OC);
    }
    void *d_x = up_act_off(x, nx, off), *d_w = up_act_off(w, nw, off);
    void *d_dout = up_act_off(dout, ny, off);

    void *d_y = up_act_off(nan_f(ny), ny, off);
    ops->matmul_fwd(d_y, d_x, d_w, N, C, OC, NULL);
    snprintf(name, sizeof name, "matmul_fwd out (=, no residual) %s", tag);
    check_close(name, got_act(d_y, ny), py, ny, t_act);

    double *with_res = sum_d(py, from_f(y0, ny), ny);
    void *d_res = up_act_off(y0, ny, off);
    d_y = up_act_off(nan_f(ny), ny, off);
    ops->matmul_fwd(d_y, d_x, d_w, N, C, OC, d_res);
    snprintf(name, sizeof name, "matmul_fwd out (= product + separate residual) %s", tag);
    check_close(name, got_act(d_y, ny), with_res, ny, t_act);
    snprintf(name, sizeof name, "matmul_fwd residual input unchanged %s", tag);
    check_same(name, got_act(d_res, ny), y0, ny);

    d_y = up_act_off(y0, ny, off);
    ops->matmul_fwd(d_y, d_x, d_w, N, C, OC, d_y);
    snprintf(name, sizeof name, "matmul_fwd out (+=, residual aliases out) %s", tag);
    check_close(name, got_act(d_y, ny), with_res, ny, t_act);

    /* backward: the expected dinp and dweight follow each call, in double */
    void *d_dx = up_act_off(dx0, nx, off);
    float *d_dw = up_f32(dw0, nw);
    double *ex = from_f(dx0, nx), *ew = from_f(dw0, nw);
    static const struct {
        int dinp, dweight, flags;
        const char *what;
    } calls[] = {
        {1, 1, 0, "both +="},
        {0, 1, 0, "dinp NULL"},
        {1, 0, 0, "dweight NULL"},
        {1, 1, SHLM_MM_SET_DINP, "SET_DINP"},
        {1, 1, SHLM_MM_SET_DWEIGHT, "SET_DWEIGHT"},
        {1, 1, SHLM_MM_SET_DINP | SHLM_MM_SET_DWEIGHT, "both SET"},
    };
    for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++) {
        float *before_dx = got_act(d_dx, nx), *before_dw = got_f32(d_dw, nw);
        ops->matmul_bwd(calls[k].dinp ? d_dx : NULL, calls[k].dweight ? d_dw : NULL, d_dout, d_x,
                        d_w, N, C, OC, calls[k].flags);
        if (calls[k].dinp)
            ex = calls[k].flags & SHLM_MM_SET_DINP ? sum_d(pdx, NULL, nx) : sum_d(ex, pdx, nx);
        if (calls[k].dweight)
            ew = calls[k].flags & SHLM_MM_SET_DWEIGHT ? sum_d(pdw, NULL, nw) : sum_d(ew, pdw, nw);
        float *gx = got_act(d_dx, nx), *gw = got_f32(d_dw, nw);
        snprintf(name, sizeof name, "matmul_bwd %s: dinp %s %s", calls[k].what,
                 calls[k].dinp ? (calls[k].flags & SHLM_MM_SET_DINP ? "(=)" : "(+=)") : "unchanged",
                 tag);
        if (calls[k].dinp) check_close(name, gx, ex, nx, t_act);
        else check_same(name, gx, before_dx, nx);
        snprintf(name, sizeof name, "matmul_bwd %s: dweight %s %s", calls[k].what,
                 calls[k].dweight ? (calls[k].flags & SHLM_MM_SET_DWEIGHT ? "(=)" : "(+=)")
                                  : "unchanged",
                 tag);
        if (calls[k].dweight) check_close(name, gw, ew, nw, t_dw);
        else check_same(name, gw, before_dw, nw);
        /* re-anchor on what the backend holds, so that one rounding per call is all the
         * comparison sees on a bf16 backend */
        ex = from_f(gx, nx);
        ew = from_f(gw, nw);
    }

    if (with_fd) {
        double *gx = hd(nx), *gw = hd(nw);
        ref_matmul_bwd(gx, gw, c.dout, c.x, c.w, N, C, OC);
        check_fd("matmul dinp", mm_loss, &c, c.x, nx, gx);
        check_fd("matmul dweight", mm_loss, &c, c.w, nw, gw);
    }
    release_all();
}

static void test_matmul(void) {
    matmul_case(91, 37, 29, 0, 0, 1);
    matmul_case(1, 1, 1, 0, 0, 0);
    matmul_case(1, 3, 2, 1, 0, 0);
    matmul_case(33, 47, 65, 1, 0, 0);
    matmul_case(128, 256, 384, 0, 0, 0);
    if (!is_cpu && !small_only) {
        matmul_case(256, 4096, 6144, 0, 1, 0);  /* fused QKV, GQA (32 q + 2·8 kv heads of 128) */
        matmul_case(128, 11008, 4096, 0, 1, 0); /* down_proj */
        matmul_case(64, 4096, 32000, 0, 1, 0);  /* lm_head */
        /* a decode step's few rows (cuda: gemv.cu): one, a batch, the most it takes */
        matmul_case(1, 4096, 12288, 0, 1, 0);
        matmul_case(3, 11008, 4096, 0, 1, 0);
        matmul_case(8, 4096, 32000, 0, 1, 0);
    }
    matmul_case(1, 264, 37, 0, 0, 0); /* a few rows, an odd count of outputs */
    matmul_case(5, 40, 17, 0, 0, 0);
    matmul_case(9, 64, 24, 0, 0, 0);  /* past the few-row kernel */
}

/* ---- bias ---- */
typedef struct bias_ctx {
    double *x, *b, *dout, *out;
    int N, C;
} bias_ctx;
static double bias_loss(void *p) {
    bias_ctx *c = p;
    ref_bias_add(c->out, c->x, c->b, c->N, c->C);
    return dot_d(c->out, c->dout, (size_t)c->N * c->C);
}

/* One shape; off as matmul_case's (the bias is a tensor in the middle of a unit). The add
 * in place, the gradient as "=" (over NaN) and as "+=", and a rerun giving the same bits. */
static void bias_case(int N, int C, int off, int with_fd) {
    char tag[64], name[160];
    snprintf(tag, sizeof tag, "(N=%d C=%d%s)", N, C, off ? ", unaligned" : "");
    const size_t nx = (size_t)N * C;
    float *x = rnd_act(nx, 1.0), *b = rnd_act((size_t)C, 1.0), *dout = rnd_act(nx, 1.0);
    float *db0 = rnd_f((size_t)C, 1.0);
    bias_ctx c = {dup_d(x, nx), dup_d(b, (size_t)C), dup_d(dout, nx), hd(nx), N, C};
    double *want = hd(nx), *dref = hd((size_t)C);
    ref_bias_add(want, c.x, c.b, N, C);
    ref_bias_grad(dref, c.dout, N, C);

    void *d_x = up_act_off(x, nx, off), *d_b = up_act_off(b, (size_t)C, off);
    ops->bias_add(d_x, d_b, N, C);
    snprintf(name, sizeof name, "bias_add x (+=) %s", tag);
    check_close(name, got_act(d_x, nx), want, nx, T_BIAS_ADD);

    void *d_dout = up_act_off(dout, nx, off);
    float *d_db = nan_f32_dev((size_t)C);
    ops->bias_grad(d_db, d_dout, N, C, 1);
    float *first = got_f32(d_db, (size_t)C);
    snprintf(name, sizeof name, "bias_grad dbias (=) %s", tag);
    check_close(name, first, dref, (size_t)C, T_BIAS_GRAD);
    ops->bias_grad(d_db, d_dout, N, C, 1);
    snprintf(name, sizeof name, "bias_grad rerun: the same bits %s", tag);
    check_same(name, got_f32(d_db, (size_t)C), first, (size_t)C);

    float *d_acc = up_f32(db0, (size_t)C);
    ops->bias_grad(d_acc, d_dout, N, C, 0);
    snprintf(name, sizeof name, "bias_grad dbias (+=) %s", tag);
    check_close(name, got_f32(d_acc, (size_t)C), sum_d(dref, from_f(db0, (size_t)C), (size_t)C),
                (size_t)C, T_BIAS_GRAD);
    if (with_fd) check_fd("bias dbias", bias_loss, &c, c.b, (size_t)C, dref);
    release_all();
}

static void test_bias(void) {
    bias_case(7 * 13, 23, 0, 1);
    bias_case(1, 1, 0, 0);
    bias_case(1, 3, 1, 0);
    bias_case(13, 37, 1, 0);
    bias_case(5, 64, 0, 0);    /* C % 8 == 0: the 8-wide paths */
    bias_case(300, 264, 0, 0); /* N beyond a block's row lanes, C beyond its columns */
    bias_case(600, 2000, 0, 0);
    if (!is_cpu && !small_only) bias_case(4096, 4608, 0, 0); /* Qwen2.5-7B's q|k|v at 4096 tokens */
}

/* ---- rope ---- */
/* RoPE's default description (kernels/rope_freq.h) for heads of hd: what the model makes */
static shlm_rope rope_default(int hd, double theta) {
    shlm_rope r;
    const shlm_rope_params p = {.type = SHLM_ROPE_DEFAULT, .theta = theta};
    char why[256];
    if (shlm_rope_init(&r, hd, &p, why, sizeof why) != 0) {
        fprintf(stderr, "test_ops: %s\n", why);
        exit(1);
    }
    return r;
}

typedef struct rope_ctx {
    double *x, *dout, *out;
    int N, T, stride, n_heads, hd;
    const double *freq;
    const int32_t *pos0;
} rope_ctx;
static double rope_loss(void *p) {
    rope_ctx *c = p;
    ref_rope_fwd(c->out, c->x, c->N, c->T, c->stride, c->n_heads, c->hd, c->freq, c->pos0);
    return dot_d(c->out, c->dout, (size_t)c->N * c->stride);
}

/* N rows of `stride` under the description rope, whose frequencies the reference takes as
 * freq (written out independently for the default type); pos0: NULL or N/T host offsets
 * (uploaded). what names the description. */
static void rope_case(int N, int T, int stride, int n_heads, const shlm_rope *rope,
                      const double *freq, const int32_t *pos0, const char *what, tol_id tol,
                      int with_fd) {
    const int hdim = rope->head_dim;
    const size_t n = (size_t)N * stride;
    char tag[160], name[256];
    snprintf(tag, sizeof tag, "(N=%d T=%d stride=%d heads=%d hd=%d %s%s)", N, T, stride,
             n_heads, hdim, what, pos0 ? ", pos0" : "");
    float *x = rnd_act(n, 1.0), *dout = rnd_act(n, 1.0), *got = hf(n);
    rope_ctx c = {dup_d(x, n), dup_d(dout, n), hd(n), N, T, stride, n_heads, hdim, freq, pos0};
    double *ref = hd(n);
    void *d_x = up_act(x, n);
    const int32_t *d_pos0 = pos0 ? up_i32(pos0, (size_t)(N / T)) : NULL;

    ops->rope(d_x, N, T, stride, n_heads, rope, d_pos0, 0);
    ref_rope_fwd(ref, c.x, N, T, stride, n_heads, hdim, freq, pos0);
    down_act(got, d_x, n);
    snprintf(name, sizeof name, "rope forward %s", tag);
    check_close(name, got, ref, n, tol);
    if (stride > n_heads * hdim) { /* heads past n_heads (the v heads) stay untouched */
        int same = 1;
        for (int r = 0; r < N; r++)
            same &= memcmp(got + (size_t)r * stride + n_heads * hdim,
                           x + (size_t)r * stride + n_heads * hdim,
                           (size_t)(stride - n_heads * hdim) * sizeof(float)) == 0;
        snprintf(name, sizeof name, "rope leaves heads >= n_heads alone %s", tag);
        check_true(name, same);
    }

    /* inverse(forward(x)) == x: two roundings on a bf16 backend, within the same tol */
    ops->rope(d_x, N, T, stride, n_heads, rope, d_pos0, 1);
    down_act(got, d_x, n);
    snprintf(name, sizeof name, "rope inverse(forward(x)) == x %s", tag);
    check_close(name, got, c.x, n, tol);

    /* inverse applied to dout is the backward pass Jᵀ·dout */
    d_x = up_act(dout, n);
    ops->rope(d_x, N, T, stride, n_heads, rope, d_pos0, 1);
    ref_rope_bwd(ref, c.dout, N, T, stride, n_heads, hdim, freq, pos0);
    down_act(got, d_x, n);
    snprintf(name, sizeof name, "rope inverse == backward %s", tag);
    check_close(name, got, ref, n, tol);
    if (with_fd) check_fd("rope dx", rope_loss, &c, c.x, n, ref);
    release_all();
}

/* a fused qkv buffer of B sequences of T: q and k heads rotate (n_heads = nh + nkv), v
 * heads do not; positions wrap at T */
static void rope_qkv_case(int B, int T, int nh, int nkv, int hdim, float theta, int with_fd) {
    const shlm_rope r = rope_default(hdim, theta);
    char what[64];
    snprintf(what, sizeof what, "theta=%g", theta);
    rope_case(B * T, T, (nh + 2 * nkv) * hdim, nh + nkv, &r, ref_rope_freq(hdim, theta), NULL,
              what, T_ROPE, with_fd);
}

/* Sequences that start at positions pos0 (a decode step's new tokens after their rows'
 * cached ones): B sequences of T at offsets up to max_pos, the model's qkv layout */
static void rope_offset_case(int B, int T, int nh, int nkv, int hdim, int max_pos, tol_id tol,
                             int with_fd) {
    const shlm_rope r = rope_default(hdim, 10000.0);
    int32_t *pos0 = xcalloc((size_t)B, sizeof(int32_t));
    for (int b = 0; b < B; b++) pos0[b] = b == 0 ? 0 : b == 1 ? max_pos : rnd_int(max_pos + 1);
    rope_case(B * T, T, (nh + 2 * nkv) * hdim, nh + nkv, &r, ref_rope_freq(hdim, 10000.0), pos0,
              "theta=10000", tol, with_fd);
}

/* The kernels take the description's frequencies, whatever made them: Llama 3.1's bands
 * (kernels/rope_freq.h, tested against transformers by tests/rope_freq_ref.sh) at
 * positions past the band edges' wavelengths, the reference fed the same frequencies */
static void rope_scaled_case(void) {
    const shlm_rope_params p = {.type = SHLM_ROPE_LLAMA3, .theta = 500000.0, .factor = 8.0,
                                .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                                .original_max_position_embeddings = 64};
    shlm_rope r;
    char why[256];
    if (shlm_rope_init(&r, 64, &p, why, sizeof why) != 0) {
        fprintf(stderr, "test_ops: %s\n", why);
        exit(1);
    }
    /* the reference's copies are host buffers, released by each case */
    double *freq = hd_alloc_freq(64);
    memcpy(freq, r.freq, 32 * sizeof(double));
    rope_case(2 * 300, 300, (4 + 2 * 2) * 64, 4 + 2, &r, freq, NULL, "llama3", T_ROPE, 0);
    freq = hd_alloc_freq(64);
    memcpy(freq, r.freq, 32 * sizeof(double));
    int32_t *pos0 = xcalloc(3, sizeof(int32_t));
    pos0[0] = 0, pos0[1] = 1000, pos0[2] = 37;
    rope_case(3 * 5, 5, (4 + 2 * 2) * 64, 4 + 2, &r, freq, pos0, "llama3", T_ROPE_LONG, 1);
}

static void test_rope(void) {
    rope_qkv_case(7, 13, 6, 2, 10, 10000.0f, 1);
    rope_qkv_case(1, 1, 1, 1, 2, 10000.0f, 0);
    rope_qkv_case(2, 37, 4, 2, 10, 10000.0f, 0);
    rope_qkv_case(2, 64, 8, 2, 128, 10000.0f, 0);
    rope_qkv_case(2, 256, 4, 4, 64, 500000.0f, 0);
    {
        const shlm_rope r = rope_default(64, 10000.0);
        rope_case(4096, 4096, 64, 1, &r, ref_rope_freq(64, 10000.0), NULL, "theta=10000",
                  T_ROPE_LONG, 0);
    }
    /* offsets: one token per row (a decode step), a few per row, odd widths (the
     * element-wise kernel), positions past 4000 */
    rope_offset_case(5, 1, 4, 2, 64, 4000, T_ROPE_LONG, 1);
    rope_offset_case(3, 7, 6, 2, 10, 300, T_ROPE, 1);
    rope_offset_case(4, 3, 32, 8, 128, 4095, T_ROPE_LONG, 0);
    rope_scaled_case();
}

/* ---- attention ---- */
typedef struct attn_ctx {
    double *qkv, *dout, *out;
    const int32_t *doc;
    attn_shape s;
} attn_ctx;
static double attn_loss(void *p) {
    attn_ctx *c = p;
    ref_attention_fwd(c->out, NULL, c->qkv, c->doc, c->s);
    return dot_d(c->out, c->dout, (size_t)c->s.B * c->s.T * c->s.nh * c->s.hd);
}

/* dqkv's q, k and v parts each on its own (a wrong small one cannot hide behind a large
 * other), then the whole. A part whose reference is zero everywhere (dq and dk at T = 1,
 * where every row sees only itself and dS = 0) is measured against max|dqkv| instead: a
 * backend's dS there is the rounding residue of dP - rowsum(dO.O), not exactly 0. */
static void check_qkv(const char *what, const char *tag, const float *got, const double *want,
                      attn_shape s, tol_id id) {
    static const char *const part_name[3] = {"dq", "dk", "dv"};
    const int N = s.B * s.T, C3 = (s.nh + 2 * s.nkv) * s.hd;
    const int part_off[3] = {0, s.nh * s.hd, (s.nh + s.nkv) * s.hd};
    const int part_w[3] = {s.nh * s.hd, s.nkv * s.hd, s.nkv * s.hd};
    char name[224];
    for (int p = 0; p < 3; p++) {
        const size_t m = (size_t)N * part_w[p];
        float *a = hf(m);
        double *r = hd(m);
        for (int i = 0; i < N; i++) {
            memcpy(a + (size_t)i * part_w[p], got + (size_t)i * C3 + part_off[p],
                   (size_t)part_w[p] * sizeof(float));
            memcpy(r + (size_t)i * part_w[p], want + (size_t)i * C3 + part_off[p],
                   (size_t)part_w[p] * sizeof(double));
        }
        snprintf(name, sizeof name, "attention_bwd %s %s %s", what, part_name[p], tag);
        if (tol_table[id].crit == CRIT_MAXREL && max_abs(r, m) == 0.0)
            report(name, max_err_over(a, r, m, max_abs(want, (size_t)N * C3)), id);
        else
            check_close(name, a, r, m, id);
    }
    snprintf(name, sizeof name, "attention_bwd %s dqkv %s", what, tag);
    check_close(name, got, want, (size_t)N * C3, id);
}

/* One shape under one mask. doc: NULL, or B·T document starts (host), named by `layout`.
 * by_cpu: the expected values come from the cpu backend on the same inputs (Llama-sized
 * shapes, relative L2; the backward from this backend's own out and lse) instead of the
 * double reference. Checks the forward, the backward without and with rope, reruns
 * bit for bit, the fused rope against the backend's own backward then rope, dv unrotated,
 * and (doc NULL) that an all-zero doc_start gives NULL's bits. */
static void attention_case(attn_shape s, const int32_t *doc, const char *layout, int by_cpu) {
    const int N = s.B * s.T, C3 = (s.nh + 2 * s.nkv) * s.hd;
    const size_t nqkv = (size_t)N * C3, no = (size_t)N * s.nh * s.hd, nl = (size_t)s.B * s.nh * s.T;
    const shlm_rope rope = rope_default(s.hd, 10000.0);
    const double *freq = ref_rope_freq(s.hd, 10000.0);
    char tag[128], name[224];
    snprintf(tag, sizeof tag, "(B=%d T=%d nh=%d nkv=%d hd=%d%s%s%s)", s.B, s.T, s.nh, s.nkv, s.hd,
             doc ? ", " : "", doc ? layout : "", by_cpu ? ", vs cpu" : "");
    const tol_id t_out = by_cpu ? T_CPU_ACT : T_ATT_OUT, t_lse = by_cpu ? T_CPU_F32 : T_ATT_LSE;
    const tol_id t_bwd = by_cpu ? T_CPU_ATT_BWD : T_ATT_BWD;
    /* scale 1.5: peaked enough that the softmax is far from uniform */
    float *qkv = rnd_act(nqkv, 1.5), *dout = rnd_act(no, 1.0);
    attn_ctx c = {dup_d(qkv, nqkv), dup_d(dout, no), hd(no), doc, s};
    void *d_qkv = up_act(qkv, nqkv), *d_dout = up_act(dout, no);
    void *d_out = nan_act(no), *d_dqkv = nan_act(nqkv);
    float *d_lse = nan_f32_dev(nl);
    const int32_t *d_doc = doc ? up_i32(doc, (size_t)N) : NULL;

    ops->attention_fwd(d_out, d_lse, d_qkv, d_doc, s.B, s.T, s.nh, s.nkv, s.hd);
    float *out = got_act(d_out, no), *lse = got_f32(d_lse, nl);
    double *want_out, *want_lse, *want_dqkv, *want_rot = hd(nqkv);
    if (by_cpu) {
        float *co = hf(no), *cl = hf(nl), *cg = hf(nqkv);
        cpu->attention_fwd(co, cl, qkv, doc, s.B, s.T, s.nh, s.nkv, s.hd);
        cpu->attention_bwd(cg, dout, qkv, out, lse, doc, s.B, s.T, s.nh, s.nkv, s.hd, NULL);
        want_out = from_f(co, no), want_lse = from_f(cl, nl), want_dqkv = from_f(cg, nqkv);
    } else {
        want_out = hd(no), want_lse = hd(nl), want_dqkv = hd(nqkv);
        ref_attention_fwd(want_out, want_lse, c.qkv, doc, s);
        ref_attention_bwd(want_dqkv, c.dout, c.qkv, doc, s);
    }
    /* with rope: the gradient w.r.t. the pre-RoPE q and k (ops.h) */
    ref_rope_bwd(want_rot, want_dqkv, N, s.T, C3, s.nh + s.nkv, s.hd, freq, NULL);
    snprintf(name, sizeof name, "attention_fwd out %s", tag);
    check_close(name, out, want_out, no, t_out);
    snprintf(name, sizeof name, "attention_fwd lse %s", tag);
    check_close(name, lse, want_lse, nl, t_lse);

    ops->attention_bwd(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_doc, s.B, s.T, s.nh, s.nkv, s.hd,
                       NULL);
    float *dqkv = got_act(d_dqkv, nqkv);
    check_qkv("(=)", tag, dqkv, want_dqkv, s, t_bwd);
    void *d_again = nan_act(nqkv);
    ops->attention_bwd(d_again, d_dout, d_qkv, d_out, d_lse, d_doc, s.B, s.T, s.nh, s.nkv, s.hd,
                       NULL);
    snprintf(name, sizeof name, "attention_bwd rerun: the same bits %s", tag);
    check_same(name, got_act(d_again, nqkv), dqkv, nqkv);

    void *d_rot = nan_act(nqkv);
    ops->attention_bwd(d_rot, d_dout, d_qkv, d_out, d_lse, d_doc, s.B, s.T, s.nh, s.nkv, s.hd,
                       &rope);
    float *rot = got_act(d_rot, nqkv);
    check_qkv("rope", tag, rot, want_rot, s, t_bwd);
    d_again = nan_act(nqkv);
    ops->attention_bwd(d_again, d_dout, d_qkv, d_out, d_lse, d_doc, s.B, s.T, s.nh, s.nkv, s.hd,
                       &rope);
    snprintf(name, sizeof name, "attention_bwd rope rerun: the same bits %s", tag);
    check_same(name, got_act(d_again, nqkv), rot, nqkv);
    /* against this backend's own backward then rope(inverse) */
    ops->rope(d_dqkv, N, s.T, C3, s.nh + s.nkv, &rope, NULL, 1);
    snprintf(name, sizeof name, "attention_bwd rope == bwd then rope %s", tag);
    check_close(name, rot, from_f(got_act(d_dqkv, nqkv), nqkv), nqkv, T_ATT_ROPE_FUSED);
    {
        const size_t w = (size_t)s.nkv * s.hd, off = (size_t)(s.nh + s.nkv) * s.hd;
        int same = 1;
        for (int i = 0; i < N && same; i++)
            same = memcmp(rot + (size_t)i * C3 + off, dqkv + (size_t)i * C3 + off,
                          w * sizeof(float)) == 0;
        snprintf(name, sizeof name, "attention_bwd rope leaves dv's bits %s", tag);
        check_true(name, same);
    }

    if (!doc) { /* an all-zero doc_start runs the document paths and gives NULL's bits */
        const int32_t *d_zeros = up_i32(xcalloc((size_t)N, sizeof(int32_t)), (size_t)N);
        void *z_out = nan_act(no), *z_dqkv = nan_act(nqkv), *z_rot = nan_act(nqkv);
        float *z_lse = nan_f32_dev(nl);
        ops->attention_fwd(z_out, z_lse, d_qkv, d_zeros, s.B, s.T, s.nh, s.nkv, s.hd);
        ops->attention_bwd(z_dqkv, d_dout, d_qkv, d_out, d_lse, d_zeros, s.B, s.T, s.nh, s.nkv,
                           s.hd, NULL);
        ops->attention_bwd(z_rot, d_dout, d_qkv, d_out, d_lse, d_zeros, s.B, s.T, s.nh, s.nkv,
                           s.hd, &rope);
        snprintf(name, sizeof name, "attention doc_start zeros == NULL: out %s", tag);
        check_same(name, got_act(z_out, no), out, no);
        snprintf(name, sizeof name, "attention doc_start zeros == NULL: lse %s", tag);
        check_same(name, got_f32(z_lse, nl), lse, nl);
        snprintf(name, sizeof name, "attention doc_start zeros == NULL: dqkv %s", tag);
        check_same(name, got_act(z_dqkv, nqkv), dqkv, nqkv);
        snprintf(name, sizeof name, "attention doc_start zeros == NULL: dqkv (rope) %s", tag);
        check_same(name, got_act(z_rot, nqkv), rot, nqkv);
    }
    if (!by_cpu && nqkv <= 20000) {
        snprintf(name, sizeof name, "attention dqkv %s", tag);
        check_fd(name, attn_loss, &c, c.qkv, nqkv, want_dqkv);
    }
    release_all();
}

/* every sequence b of the batch cut into documents by doc_layout(kind[b], maxlen)
 * (tests/doc_layout.h: several per tile, spanning tiles, single tokens, one at T - 1) */
static void attention_doc_case(attn_shape s, const enum doc_layout_kind *kind, int maxlen,
                               int by_cpu) {
    int32_t *doc = calloc_or_die((size_t)s.B * s.T, sizeof(int32_t));
    char layout[128] = "";
    for (int b = 0; b < s.B; b++) {
        doc_layout(doc + (size_t)b * s.T, s.T, kind[b], maxlen, rnd_u64);
        snprintf(layout + strlen(layout), sizeof layout - strlen(layout), "%s%s", b ? "|" : "",
                 doc_layout_name(kind[b]));
    }
    attention_case(s, doc, layout, by_cpu);
    free(doc);
}

/* cpu: a doc_start that breaks ops.h's contract aborts with a line naming it (checked in
 * a child process) */
static void attention_bad_doc_case(void) {
    const attn_shape s = {1, 5, 2, 1, 4};
    const size_t nqkv = (size_t)s.T * (s.nh + 2 * s.nkv) * s.hd;
    float *qkv = rnd_act(nqkv, 1.0), *out = hf((size_t)s.T * s.nh * s.hd), *lse = hf(s.nh * s.T);
    const int32_t bad[2][5] = {{0, 0, 3, 3, 3}, {0, 1, 1, 0, 4}}; /* 3 > t = 2; decreasing */
    for (int k = 0; k < 2; k++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            if (!freopen("/dev/null", "w", stderr)) _exit(2);
            ops->attention_fwd(out, lse, qkv, bad[k], s.B, s.T, s.nh, s.nkv, s.hd);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        check_true(k ? "attention_fwd cpu: a decreasing doc_start aborts"
                     : "attention_fwd cpu: doc_start[t] > t aborts",
                   WIFEXITED(st) && WEXITSTATUS(st) == 1);
    }
    release_all();
}

static void test_attention(void) {
    static const attn_shape plain[] = {
        {3, 13, 6, 2, 10}, /* GQA, 3 query heads per kv head */
        {3, 13, 6, 3, 10}, /* GQA, 2 per kv head */
        {2, 13, 6, 6, 10}, /* plain multi-head */
        {2, 7, 4, 1, 8},   /* multi-query */
        {2, 1, 2, 1, 4},   /* T = 1: each row sees only itself */
        {1, 1, 1, 1, 2},   /* the smallest shape */
        {1, 2, 1, 1, 2},
        /* the device kernels' tiles: 128 queries and 64 keys per block, hd padded to
         * 16/32/64/128, 16-byte loads only when hd % 8 == 0 */
        {2, 37, 4, 2, 32},
        {1, 100, 3, 1, 20}, /* hd % 8 != 0: element-wise loads */
        {2, 129, 2, 1, 16},
        {1, 65, 2, 2, 100}, /* padded to 128 */
        {1, 256, 4, 4, 64},
        {2, 300, 4, 1, 128},
    };
    for (size_t k = 0; k < sizeof plain / sizeof plain[0]; k++)
        attention_case(plain[k], NULL, NULL, 0);

    static const struct {
        attn_shape s;
        enum doc_layout_kind kind[3];
        int maxlen;
    } docs[] = {
        {{3, 13, 6, 2, 10}, {DOC_RANDOM, DOC_SHORT, DOC_LAST}, 5},
        {{2, 37, 4, 2, 8}, {DOC_RANDOM, DOC_FIXED}, 11},
        {{2, 29, 4, 4, 6}, {DOC_LAST, DOC_ONE}, 9},
        {{1, 9, 2, 1, 4}, {DOC_SHORT}, 2},
        {{2, 1, 2, 1, 4}, {DOC_ONE, DOC_LAST}, 1},
        {{2, 37, 4, 2, 32}, {DOC_SHORT, DOC_SHORT}, 0},
        {{1, 100, 3, 1, 20}, {DOC_FIXED}, 7},
        {{2, 129, 2, 1, 16}, {DOC_LAST, DOC_LAST}, 40},
        {{1, 256, 4, 4, 64}, {DOC_RANDOM}, 70},
        {{2, 300, 4, 1, 128}, {DOC_RANDOM, DOC_RANDOM}, 100},
        {{2, 300, 4, 2, 64}, {DOC_LAST, DOC_LAST}, 150},
    };
    for (size_t k = 0; k < sizeof docs / sizeof docs[0]; k++)
        attention_doc_case(docs[k].s, docs[k].kind, docs[k].maxlen, 0);
    if (is_cpu) attention_bad_doc_case();

    if (!is_cpu && !small_only) {
        attention_case((attn_shape){1, 1024, 8, 2, 128}, NULL, NULL, 1); /* Llama-like: GQA 4:1 */
        /* the cuda backward's dS scratch holds 3 of these 5 sequences: passes of 3 and 2 */
        attention_case((attn_shape){5, 2048, 16, 16, 64}, NULL, NULL, 1);
        static const enum doc_layout_kind random5[5] = {DOC_RANDOM, DOC_RANDOM, DOC_RANDOM,
                                                        DOC_RANDOM, DOC_RANDOM};
        static const enum doc_layout_kind fixed5[5] = {DOC_FIXED, DOC_FIXED, DOC_FIXED, DOC_FIXED,
                                                       DOC_FIXED};
        attention_doc_case((attn_shape){1, 1024, 8, 2, 128}, random5, 300, 1);
        attention_doc_case((attn_shape){5, 2048, 16, 16, 64}, fixed5, 512, 1);
        attention_doc_case((attn_shape){3, 1000, 8, 8, 128}, random5, 200, 1);
    }
}

/* ---- KV-cache decode ---- */
typedef struct decode_shape {
    int B, Tn, cap, nh, nkv, hd;
} decode_shape;

/* element d of kv head kh at slot p of row b in a (B, nkv, cap, hd) cache */
#define CI(s, b, kh, p, d) ((((size_t)(b) * (s).nkv + (kh)) * (s).cap + (size_t)(p)) * (s).hd + (d))

/* out (B·Tn, nh·hd) of every new query over its row's cache slots 0..pos[b]+t, the cache
 * (after the append) given */
static void ref_attention_decode(double *out, const double *kc, const double *vc,
                                 const double *qkv, const int32_t *pos, decode_shape s) {
    const int g = s.nh / s.nkv;
    const size_t C3 = (size_t)(s.nh + 2 * s.nkv) * s.hd;
    double *sc = calloc_or_die((size_t)s.cap, sizeof(double));
    const double scale = 1.0 / sqrt((double)s.hd);
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < s.Tn; t++)
            for (int h = 0; h < s.nh; h++) {
                const double *q = qkv + (size_t)(b * s.Tn + t) * C3 + (size_t)h * s.hd;
                const int kh = h / g, n = pos[b] + t + 1;
                double m = -INFINITY, z = 0.0;
                for (int j = 0; j < n; j++) {
                    double v = 0.0;
                    for (int d = 0; d < s.hd; d++) v += q[d] * kc[CI(s, b, kh, j, d)];
                    sc[j] = v * scale;
                    m = fmax(m, sc[j]);
                }
                for (int j = 0; j < n; j++) z += exp(sc[j] - m);
                double *o = out + (size_t)(b * s.Tn + t) * s.nh * s.hd + (size_t)h * s.hd;
                for (int d = 0; d < s.hd; d++) {
                    double acc = 0.0;
                    for (int j = 0; j < n; j++) acc += exp(sc[j] - m) / z * vc[CI(s, b, kh, j, d)];
                    o[d] = acc;
                }
            }
    free(sc);
}

/* equal values, NaN equal to NaN (a bf16 NaN comes back with another payload) */
static int same_or_both_nan(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])))) return 0;
    return 1;
}

/* One decode step: rows b hold pos[b] random tokens (right padding: the slots after them
 * hold NaN, which must never be read), Tn new tokens each. Checks kv_append and
 * attention_decode (both writing the cache: new k, v at their slots, every other slot's
 * value unchanged) and out against the double reference; a rerun gives the same bits. */
static void decode_case(decode_shape s, const int32_t *pos) {
    const size_t C3 = (size_t)(s.nh + 2 * s.nkv) * s.hd, N = (size_t)s.B * s.Tn;
    const size_t nqkv = N * C3, no = N * s.nh * s.hd, nc = (size_t)s.B * s.nkv * s.cap * s.hd;
    char tag[160], name[256];
    int maxpos = 0;
    for (int b = 0; b < s.B; b++) maxpos = pos[b] > maxpos ? pos[b] : maxpos;
    snprintf(tag, sizeof tag, "(B=%d Tn=%d cap=%d nh=%d nkv=%d hd=%d pos[0]=%d max %d)", s.B, s.Tn,
             s.cap, s.nh, s.nkv, s.hd, pos[0], maxpos);
    float *qkv = rnd_act(nqkv, 1.5), *kc = nan_f(nc), *vc = nan_f(nc);
    for (int b = 0; b < s.B; b++)
        for (int kh = 0; kh < s.nkv; kh++)
            for (int p = 0; p < pos[b]; p++)
                for (int d = 0; d < s.hd; d++) {
                    kc[CI(s, b, kh, p, d)] = (float)(1.5 * rnd_normal());
                    vc[CI(s, b, kh, p, d)] = (float)rnd_normal();
                }
    act_round(kc, nc);
    act_round(vc, nc);
    /* the cache after the append */
    float *want_k = dup_f(kc, nc), *want_v = dup_f(vc, nc);
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < s.Tn; t++)
            for (int kh = 0; kh < s.nkv; kh++)
                for (int d = 0; d < s.hd; d++) {
                    const size_t row = (size_t)(b * s.Tn + t) * C3;
                    want_k[CI(s, b, kh, pos[b] + t, d)] = qkv[row + (size_t)(s.nh + kh) * s.hd + d];
                    want_v[CI(s, b, kh, pos[b] + t, d)] =
                        qkv[row + (size_t)(s.nh + s.nkv + kh) * s.hd + d];
                }
    double *want = hd(no);
    ref_attention_decode(want, dup_d(want_k, nc), dup_d(want_v, nc), dup_d(qkv, nqkv), pos, s);

    void *d_qkv = up_act(qkv, nqkv), *d_k = up_act(kc, nc), *d_v = up_act(vc, nc);
    const int32_t *d_pos = up_i32(pos, (size_t)s.B);
    ops->kv_append(d_k, d_v, d_qkv, d_pos, s.B, s.Tn, s.cap, s.nh, s.nkv, s.hd);
    snprintf(name, sizeof name, "kv_append: new k, v at pos[b] + t, the rest as it was %s", tag);
    check_true(name, same_or_both_nan(got_act(d_k, nc), want_k, nc) &&
                         same_or_both_nan(got_act(d_v, nc), want_v, nc));

    d_k = up_act(kc, nc), d_v = up_act(vc, nc);
    void *d_out = nan_act(no);
    ops->attention_decode(d_out, d_k, d_v, d_qkv, d_pos, s.B, s.Tn, s.cap, s.nh, s.nkv, s.hd);
    float *out = got_act(d_out, no);
    snprintf(name, sizeof name, "attention_decode out %s", tag);
    check_close(name, out, want, no, T_DECODE);
    snprintf(name, sizeof name, "attention_decode appends as kv_append %s", tag);
    check_true(name, same_or_both_nan(got_act(d_k, nc), want_k, nc) &&
                         same_or_both_nan(got_act(d_v, nc), want_v, nc));
    /* again on the appended cache (the append rewrites the same values) */
    void *d_again = nan_act(no);
    ops->attention_decode(d_again, d_k, d_v, d_qkv, d_pos, s.B, s.Tn, s.cap, s.nh, s.nkv, s.hd);
    snprintf(name, sizeof name, "attention_decode rerun: the same bits %s", tag);
    check_same(name, got_act(d_again, no), out, no);
    release_all();
}

/* decode against attention_fwd on the same q, k, v (B sequences of T): the prompt's first P
 * tokens prefilled by attention_fwd + kv_append, the rest one token per step by
 * attention_decode (pos = t, rope-free: the same rows as the forward's), then the whole
 * sequence as one attention_decode of Tn = T from an empty cache. The cpu backend gives
 * the forward's bits (ops.h); a device the forward's values within its tolerance. */
static void decode_vs_fwd_case(attn_shape s, int P) {
    const int C3 = (s.nh + 2 * s.nkv) * s.hd, CO = s.nh * s.hd, cap = s.T + 3;
    const size_t nqkv = (size_t)s.B * s.T * C3, no = (size_t)s.B * s.T * CO;
    const size_t nc = (size_t)s.B * s.nkv * cap * s.hd;
    char tag[128], name[224];
    snprintf(tag, sizeof tag, "(B=%d T=%d nh=%d nkv=%d hd=%d, prefill %d)", s.B, s.T, s.nh, s.nkv,
             s.hd, P);
    float *qkv = rnd_act(nqkv, 1.5);
    void *d_qkv = up_act(qkv, nqkv), *d_out = nan_act(no);
    float *d_lse = nan_f32_dev((size_t)s.B * s.nh * s.T);
    ops->attention_fwd(d_out, d_lse, d_qkv, NULL, s.B, s.T, s.nh, s.nkv, s.hd);
    float *fwd = got_act(d_out, no);

    /* step by step: the prefill's rows, then each later token's row */
    float *steps = nan_f(no);
    void *d_k = nan_act(nc), *d_v = nan_act(nc);
    int32_t *pos = xcalloc((size_t)s.B, sizeof(int32_t));
    int32_t *d_pos = up_i32(pos, (size_t)s.B);
    {
        float *pre = hf((size_t)s.B * P * C3);
        for (int b = 0; b < s.B; b++)
            memcpy(pre + (size_t)b * P * C3, qkv + (size_t)b * s.T * C3, (size_t)P * C3 * sizeof(float));
        void *d_pre = up_act(pre, (size_t)s.B * P * C3), *d_pout = nan_act((size_t)s.B * P * CO);
        float *d_plse = nan_f32_dev((size_t)s.B * s.nh * P);
        ops->attention_fwd(d_pout, d_plse, d_pre, NULL, s.B, P, s.nh, s.nkv, s.hd);
        ops->kv_append(d_k, d_v, d_pre, d_pos, s.B, P, cap, s.nh, s.nkv, s.hd);
        float *pout = got_act(d_pout, (size_t)s.B * P * CO);
        for (int b = 0; b < s.B; b++)
            memcpy(steps + (size_t)b * s.T * CO, pout + (size_t)b * P * CO, (size_t)P * CO * sizeof(float));
    }
    float *row = hf((size_t)s.B * C3);
    void *d_row = dalloc(act_bytes((size_t)s.B * C3)), *d_rout = dalloc(act_bytes((size_t)s.B * CO));
    float *rout = hf((size_t)s.B * CO);
    for (int t = P; t < s.T; t++) {
        for (int b = 0; b < s.B; b++) {
            pos[b] = t;
            memcpy(row + (size_t)b * C3, qkv + ((size_t)b * s.T + t) * C3, (size_t)C3 * sizeof(float));
        }
        ops->to_device(d_pos, pos, (size_t)s.B * sizeof(int32_t));
        put_act(d_row, row, (size_t)s.B * C3);
        ops->attention_decode(d_rout, d_k, d_v, d_row, d_pos, s.B, 1, cap, s.nh, s.nkv, s.hd);
        down_act(rout, d_rout, (size_t)s.B * CO);
        for (int b = 0; b < s.B; b++)
            memcpy(steps + ((size_t)b * s.T + t) * CO, rout + (size_t)b * CO, (size_t)CO * sizeof(float));
    }
    snprintf(name, sizeof name, "attention_decode token by token == attention_fwd %s", tag);
    if (is_cpu) check_same(name, steps, fwd, no);
    else check_close(name, steps, from_f(fwd, no), no, T_ATT_OUT);

    /* the whole sequence in one call */
    memset(pos, 0, (size_t)s.B * sizeof(int32_t));
    ops->to_device(d_pos, pos, (size_t)s.B * sizeof(int32_t));
    void *d_all = nan_act(no);
    ops->attention_decode(d_all, nan_act(nc), nan_act(nc), d_qkv, d_pos, s.B, s.T, cap, s.nh,
                          s.nkv, s.hd);
    snprintf(name, sizeof name, "attention_decode Tn=T from pos 0 == attention_fwd %s", tag);
    if (is_cpu) check_same(name, got_act(d_all, no), fwd, no);
    else check_close(name, got_act(d_all, no), from_f(fwd, no), no, T_ATT_OUT);
    release_all();
}

/* cpu: a pos that breaks ops.h's bounds aborts with a line naming the row (checked in a
 * child process) */
static void decode_bad_pos_case(void) {
    const decode_shape s = {2, 2, 8, 2, 1, 4};
    const size_t C3 = (size_t)(s.nh + 2 * s.nkv) * s.hd, nc = (size_t)s.B * s.nkv * s.cap * s.hd;
    float *qkv = rnd_act((size_t)s.B * s.Tn * C3, 1.0), *out = hf((size_t)s.B * s.Tn * s.nh * s.hd);
    float *kc = hf(nc), *vc = hf(nc);
    const int32_t bad[2][2] = {{0, 7}, {-1, 0}}; /* 7 + 2 > 8; negative */
    for (int k = 0; k < 2; k++) {
        for (int op = 0; op < 2; op++) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                if (!freopen("/dev/null", "w", stderr)) _exit(2);
                if (op) ops->attention_decode(out, kc, vc, qkv, bad[k], s.B, s.Tn, s.cap, s.nh, s.nkv, s.hd);
                else ops->kv_append(kc, vc, qkv, bad[k], s.B, s.Tn, s.cap, s.nh, s.nkv, s.hd);
                _exit(0);
            }
            int st = 0;
            waitpid(pid, &st, 0);
            char name[160];
            snprintf(name, sizeof name, "%s cpu: pos {%d, %d} with Tn %d, cap %d aborts",
                     op ? "attention_decode" : "kv_append", bad[k][0], bad[k][1], s.Tn, s.cap);
            check_true(name, WIFEXITED(st) && WEXITSTATUS(st) == 1);
        }
    }
    release_all();
}

/* A row whose pos breaks the bounds on a device backend: NaN out, its cache untouched, the
 * other rows as usual (ops.h) */
static void decode_bad_pos_device_case(void) {
    const decode_shape s = {2, 1, 64, 4, 2, 64};
    const size_t C3 = (size_t)(s.nh + 2 * s.nkv) * s.hd, no = (size_t)s.B * s.nh * s.hd;
    const size_t nc = (size_t)s.B * s.nkv * s.cap * s.hd;
    const int32_t pos[2] = {3, 64};
    float *kc = rnd_act(nc, 1.0);
    void *d_k = up_act(kc, nc), *d_v = up_act(kc, nc), *d_out = nan_act(no);
    void *d_qkv = up_act(rnd_act((size_t)s.B * C3, 1.0), (size_t)s.B * C3);
    ops->attention_decode(d_out, d_k, d_v, d_qkv, up_i32(pos, 2), s.B, s.Tn, s.cap, s.nh, s.nkv,
                          s.hd);
    float *out = got_act(d_out, no), *k = got_act(d_k, nc);
    int row0_ok = 1, row1_nan = 1;
    for (size_t i = 0; i < no / 2; i++) row0_ok &= !isnan(out[i]), row1_nan &= isnan(out[no / 2 + i]);
    check_true("attention_decode device: a row with pos + Tn > cap gets NaN, the others values",
               row0_ok && row1_nan);
    check_true("attention_decode device: that row's cache is left alone",
               memcmp(k + nc / 2, kc + nc / 2, nc / 2 * sizeof(float)) == 0);
    release_all();
}

static void test_decode(void) {
    /* ragged rows (right padding), GQA groups of 1 to 8, Tn 1 (a step) and more (causal
     * within the new tokens), widths of the element-wise path (hd % 8 != 0) and of the
     * device's padded tiles (20, 64, 100, 128), splits of the cache length (cap past 64
     * keys, a long row), rows of a block's query tile (group·Tn up to 8 and past it) */
    static const struct {
        decode_shape s;
        int32_t pos[4];
    } cases[] = {
        {{1, 1, 1, 1, 1, 2}, {0}},
        {{3, 1, 40, 6, 2, 10}, {0, 17, 39}},
        {{2, 3, 40, 4, 4, 8}, {5, 37}},
        {{2, 1, 300, 4, 1, 20}, {299, 64}},
        {{3, 2, 200, 8, 2, 64}, {63, 64, 198}},
        {{2, 5, 512, 8, 2, 128}, {130, 500}},
        {{1, 1, 2048, 9, 3, 64}, {2047}},
        {{2, 1, 1000, 32, 8, 128}, {999, 10}},
        {{2, 4, 130, 2, 1, 100}, {0, 126}},
        {{4, 1, 70, 16, 2, 32}, {0, 1, 68, 69}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) decode_case(cases[k].s, cases[k].pos);
    if (!small_only) {
        const int32_t pos[2] = {4095, 3000};
        decode_case((decode_shape){2, 1, 4096, 32, 8, 128}, pos); /* Llama-3-8B-like */
    }
    decode_vs_fwd_case((attn_shape){2, 37, 6, 2, 10}, 5);
    decode_vs_fwd_case((attn_shape){1, 70, 4, 1, 64}, 1);
    decode_vs_fwd_case((attn_shape){2, 20, 9, 3, 64}, 20 - 1);
    if (is_cpu) decode_bad_pos_case();
    else decode_bad_pos_device_case();
}

/* ---- swiglu ---- */
typedef struct swi_ctx {
    double *gu, *dout, *out;
    int N, F;
} swi_ctx;
static double swi_loss(void *p) {
    swi_ctx *c = p;
    ref_swiglu_fwd(c->out, c->gu, c->N, c->F);
    return dot_d(c->out, c->dout, (size_t)c->N * c->F);
}

static void swiglu_case(int N, int F, int with_fd) {
    char tag[64], name[160];
    snprintf(tag, sizeof tag, "(N=%d F=%d)", N, F);
    const size_t ng = (size_t)N * 2 * F, no = (size_t)N * F;
    float *gu = rnd_act(ng, 2.0), *dout = rnd_act(no, 1.0);
    if (ng >= 3) {
        gu[0] = 30.0f; /* saturated gate */
        gu[1] = -30.0f;
        gu[2] = -100.0f; /* exp(100) overflows fp32 in a naive sigmoid */
    }
    swi_ctx c = {dup_d(gu, ng), dup_d(dout, no), hd(no), N, F};
    double *ref = hd(no), *dref = hd(ng);
    void *d_gu = up_act(gu, ng), *d_dout = up_act(dout, no);
    void *d_out = nan_act(no), *d_dgu = nan_act(ng);

    ops->swiglu_fwd(d_out, d_gu, N, F, NULL);
    ref_swiglu_fwd(ref, c.gu, N, F);
    snprintf(name, sizeof name, "swiglu_fwd out (=) %s", tag);
    check_close(name, got_act(d_out, no), ref, no, T_SWIGLU);

    ops->swiglu_bwd(d_dgu, d_dout, d_gu, N, F, NULL);
    ref_swiglu_bwd(dref, c.dout, c.gu, N, F);
    snprintf(name, sizeof name, "swiglu_bwd dgu (=) %s", tag);
    check_close(name, got_act(d_dgu, ng), dref, ng, T_SWIGLU);
    if (with_fd) check_fd("swiglu dgu", swi_loss, &c, c.gu, ng, dref);
    {
        producer_ctx pc = {d_out, NULL, d_gu, NULL, d_dout, N, F};
        snprintf(name, sizeof name, "swiglu_fwd %s", tag);
        producer_amax_check(name, run_swiglu_fwd_amax, &pc, d_out, no);
        pc.out = d_dgu;
        snprintf(name, sizeof name, "swiglu_bwd %s", tag);
        producer_amax_check(name, run_swiglu_bwd_amax, &pc, d_dgu, ng);
        /* a NaN among the values: ignored, the amax is that of the others */
        if (ng >= 8) {
            float *gn = dup_f(gu, ng);
            gn[5] = NAN;
            pc.inp = up_act(gn, ng);
            pc.out = d_out;
            snprintf(name, sizeof name, "swiglu_fwd with a NaN gate %s", tag);
            producer_amax_check(name, run_swiglu_fwd_amax, &pc, d_out, no);
        }
    }

    /* in place, dgu aliasing gu (cpu.h documents it; the model relies on it) */
    ops->swiglu_bwd(d_gu, d_dout, d_gu, N, F, NULL);
    snprintf(name, sizeof name, "swiglu_bwd dgu aliasing gu %s", tag);
    check_close(name, got_act(d_gu, ng), dref, ng, T_SWIGLU);
    release_all();
}

static void test_swiglu(void) {
    swiglu_case(7 * 13, 23, 1);
    swiglu_case(1, 1, 0);
    swiglu_case(13, 37, 0);
    swiglu_case(5, 64, 0); /* F % 8 == 0: the 8-wide paths */
    if (!is_cpu && !small_only) swiglu_case(256, 11008, 0);
}

/* ---- cross-entropy ---- */
typedef struct xent_ctx {
    double *x, *losses;
    const int32_t *tgt;
    int N, V;
    double dscale;
} xent_ctx;
static double xent_loss(void *p) {
    xent_ctx *c = p;
    ref_xent(c->losses, NULL, c->x, c->tgt, c->N, c->V, 1.0);
    double s = 0.0;
    for (int i = 0; i < c->N; i++) s += c->losses[i];
    return s * c->dscale;
}

static void xent_case(int N, int V, int with_fd) {
    char tag[64], name[160];
    snprintf(tag, sizeof tag, "(N=%d V=%d)", N, V);
    const size_t n = (size_t)N * V;
    float *x = rnd_f(n, 3.0);
    /* rows far from zero: without the max subtraction exp() overflows (fp32 at 88.7) */
    if (N > 4)
        for (int j = 0; j < V; j++) {
            x[1 * V + j] += 1000.0f;
            x[2 * V + j] += 90.0f;
            x[4 * V + j] -= 1000.0f;
        }
    act_round(x, n);
    int32_t *tgt = xcalloc(N, sizeof(int32_t));
    for (int i = 0; i < N; i++) {
        tgt[i] = i % 5 == 3 ? -1 : rnd_int(V); /* every fifth row ignored */
        if (i == 9) tgt[i] = -100; /* any negative target is ignored (PyTorch's default) */
    }
    tgt[0] = 0;
    if (N > 5) tgt[5] = V - 1;
    int n_valid = 0;
    for (int i = 0; i < N; i++) n_valid += tgt[i] >= 0;
    const float dscale = 1.0f / (float)n_valid;
    xent_ctx c = {dup_d(x, n), hd(N), tgt, N, V, dscale};
    double *loss = hd(N), *dref = hd(n);
    ref_xent(loss, dref, c.x, tgt, N, V, dscale);

    void *d_x = up_act(x, n), *d_dx = nan_act(n), *d_t = up_i32(tgt, N);
    float *d_l = nan_f32_dev(N);
    ops->xent_fwd_bwd(d_l, d_dx, d_x, d_t, N, V, dscale);
    snprintf(name, sizeof name, "xent losses (ignored rows 0, shifted rows) %s", tag);
    check_close(name, got_f32(d_l, N), loss, N, T_XENT_LOSS);
    snprintf(name, sizeof name, "xent dlogits (=, ignored rows 0) %s", tag);
    check_close(name, got_act(d_dx, n), dref, n, T_XENT_DLOGITS);

    d_l = nan_f32_dev(N);
    ops->xent_fwd_bwd(d_l, NULL, d_x, d_t, N, V, dscale);
    snprintf(name, sizeof name, "xent losses with dlogits NULL %s", tag);
    check_close(name, got_f32(d_l, N), loss, N, T_XENT_LOSS);
    snprintf(name, sizeof name, "xent dlogits NULL leaves logits alone %s", tag);
    check_same(name, got_act(d_x, n), x, n);

    d_l = nan_f32_dev(N);
    ops->xent_fwd_bwd(d_l, d_x, d_x, d_t, N, V, dscale); /* in place */
    snprintf(name, sizeof name, "xent losses with dlogits == logits %s", tag);
    check_close(name, got_f32(d_l, N), loss, N, T_XENT_LOSS);
    snprintf(name, sizeof name, "xent dlogits == logits (in place) %s", tag);
    check_close(name, got_act(d_x, n), dref, n, T_XENT_DLOGITS);

    if (with_fd) check_fd("xent dlogits", xent_loss, &c, c.x, n, dref);
    release_all();
}

/* A target outside the vocabulary cannot abort on a device: its loss must be NaN (the cpu
 * backend aborts naming it instead). */
static void xent_bad_target_case(void) {
    const int N = 2, V = 64;
    float *logits = rnd_act((size_t)N * V, 1.0), *got = hf(N);
    int32_t tgt[2] = {3, V};
    void *d_x = up_act(logits, (size_t)N * V), *d_t = up_i32(tgt, N);
    float *d_l = up_f32(got, N);
    ops->xent_fwd_bwd(d_l, d_x, d_x, d_t, N, V, 1.0f);
    down_f32(got, d_l, N);
    check_true("xent target >= V: that row's loss is NaN, the other's is not",
               isnan(got[1]) && !isnan(got[0]));
    release_all();
}

static void test_xent(void) {
    xent_case(7 * 13, 67, 1);
    xent_case(1, 2, 0);
    xent_case(2, 3, 0);
    xent_case(7, 1001, 0);
    xent_case(64, 32000, 0);
    if (!is_cpu) xent_bad_target_case();
}

/* ---- optimizer and reductions ---- */
static void test_adamw(void) {
    const size_t n = 1003;
    const float lr = 0.05f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gscale = 0.37f;
    const int steps[] = {1, 2, 3, 10, 1000}; /* bias correction from large to ~none */
    /* weights ~ N(0, 0.25): the update check then resolves lr-sized steps well */
    float *p = rnd_f(n, 0.5), *m = hf(n), *v = hf(n), *got = hf(n);
    float *d_p = up_f32(p, n), *d_m = up_f32(m, n), *d_v = up_f32(v, n);
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        float *g = rnd_f(n, 0.5 + k);
        g[0] = 0.0f; /* zero gradient: only decay and momentum move it */
        float *d_g = up_f32(g, n);
        /* the reference starts from the backend's current state: no drift between them */
        down_f32(p, d_p, n);
        down_f32(m, d_m, n);
        down_f32(v, d_v, n);
        double *rp = dup_d(p, n), *rm = dup_d(m, n), *rv = dup_d(v, n), *rg = dup_d(g, n);
        ref_adamw(rp, rg, rm, rv, n, lr, b1, b2, eps, wd, gscale, steps[k]);
        /* the last step takes the amax of what it writes, into a float that holds one already
         * below it (the op keeps the larger) */
        const int last = k + 1 == sizeof steps / sizeof steps[0];
        float *d_amax = up_f32(&(float){1e-6f}, 1);
        ops->adamw(d_p, d_g, d_m, d_v, n, lr, b1, b2, eps, wd, gscale, steps[k], last ? d_amax : NULL);
        char name[128];
        down_f32(got, d_p, n);
        if (last) {
            float want = 1e-6f;
            for (size_t i = 0; i < n; i++) want = fmaxf(want, fabsf(got[i]));
            check_same("adamw amax == max |param| written (step 1000)", got_f32(d_amax, 1), &want, 1);
        }
        snprintf(name, sizeof name, "adamw param (step %d, grad_scale, wd)", steps[k]);
        check_close(name, got, rp, n, T_ADAMW);
        /* the update itself, so that a wrong step cannot hide behind |param| */
        float *delta = hf(n);
        double *rdelta = hd(n);
        for (size_t i = 0; i < n; i++) {
            delta[i] = (float)((double)got[i] - p[i]);
            rdelta[i] = rp[i] - p[i];
        }
        snprintf(name, sizeof name, "adamw update param_new - param (step %d)", steps[k]);
        check_close(name, delta, rdelta, n, T_ADAMW);
        down_f32(got, d_m, n);
        snprintf(name, sizeof name, "adamw m (step %d)", steps[k]);
        check_close(name, got, rm, n, T_ADAMW);
        down_f32(got, d_v, n);
        snprintf(name, sizeof name, "adamw v (step %d)", steps[k]);
        check_close(name, got, rv, n, T_ADAMW);
    }
    release_all();
}

/* Device backends: AdamW (two steps), sum_squares and accumulate on n elements starting
 * `off` into their buffers, against the cpu backend on the same values: the same fp32
 * operations in the same order give the same bits. */
static void adamw_vs_cpu_case(size_t n, int off) {
    char tag[64], name[128];
    snprintf(tag, sizeof tag, "(n=%zu%s)", n, off ? ", unaligned" : "");
    const size_t na = n + 1;
    float *p = rnd_f(na, 0.02), *g = rnd_f(na, 0.01), *m = rnd_f(na, 1e-3), *v = rnd_f(na, 1e-3);
    for (size_t i = 0; i < na; i++) v[i] *= v[i]; /* second moments are >= 0 */
    float *d_p = up_f32(p, na), *d_g = up_f32(g, na), *d_m = up_f32(m, na), *d_v = up_f32(v, na);
    const int steps[2] = {1, 10};
    /* the second step also takes the amax of what it writes (unaligned n, grid-wide) */
    float *d_amax = up_f32(&(float){0.0f}, 1);
    for (int s = 0; s < 2; s++) {
        cpu->adamw(p + off, g + off, m + off, v + off, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f,
                   steps[s], NULL);
        ops->adamw(d_p + off, d_g + off, d_m + off, d_v + off, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                   0.5f, steps[s], s == 1 ? d_amax : NULL);
    }
    float want_amax = 0.0f;
    for (size_t i = 0; i < n; i++) want_amax = fmaxf(want_amax, fabsf(p[off + i]));
    snprintf(name, sizeof name, "adamw amax == max |param| written %s", tag);
    check_same(name, got_f32(d_amax, 1), &want_amax, 1);
    snprintf(name, sizeof name, "adamw param == cpu's after steps 1, 10 %s", tag);
    check_same(name, got_f32(d_p + off, n), p + off, n);
    snprintf(name, sizeof name, "adamw m == cpu's %s", tag);
    check_same(name, got_f32(d_m + off, n), m + off, n);
    snprintf(name, sizeof name, "adamw v == cpu's %s", tag);
    check_same(name, got_f32(d_v + off, n), v + off, n);

    double ss = ops->sum_squares(d_p + off, n), ss_cpu = cpu->sum_squares(p + off, n);
    snprintf(name, sizeof name, "sum_squares against cpu's %s", tag);
    report(name, fabs(ss - ss_cpu) / ss_cpu, T_SUMSQ);

    ops->accumulate(d_m + off, d_g + off, n);
    cpu->accumulate(m + off, g + off, n);
    snprintf(name, sizeof name, "accumulate y += x == cpu's %s", tag);
    check_same(name, got_f32(d_m + off, n), m + off, n);
    release_all();
}

static void test_adamw_all(void) {
    test_adamw();
    if (!is_cpu) {
        adamw_vs_cpu_case(1001, 1);
        if (!small_only) adamw_vs_cpu_case((1u << 22) + 3, 0);
    }
}

static void test_reductions(void) {
    const size_t sizes[] = {1, 5, 4097, 1000003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *x = rnd_f(n, 1.0);
        long double want = 0.0L;
        for (size_t i = 0; i < n; i++) want += (long double)x[i] * x[i];
        float *d = up_f32(x, n);
        double got = ops->sum_squares(d, n);
        char name[96];
        snprintf(name, sizeof name, "sum_squares n=%zu (double accumulation)", n);
        report(name, fabs(got - (double)want) / (double)want, T_SUMSQ);
    }
    check_true("sum_squares n=0 is 0", ops->sum_squares(NULL, 0) == 0.0);

    const size_t sizes_acc[] = {1, 1001};
    for (size_t k = 0; k < 2; k++) {
        const size_t n = sizes_acc[k];
        float *x = rnd_f(n, 1.0), *y = rnd_f(n, 1.0), *got = hf(n);
        double *want = hd(n);
        for (size_t i = 0; i < n; i++) want[i] = (double)y[i] + (double)x[i];
        float *d = up_f32(x, n), *dy = up_f32(y, n);
        ops->accumulate(dy, d, n);
        down_f32(got, dy, n);
        char name[96];
        snprintf(name, sizeof name, "accumulate y += x (n=%zu)", n);
        check_close(name, got, want, n, T_ACCUM);
    }
    release_all();
}

/* ---- cpu: same inputs give bit-identical results, whatever the thread count ---- */
enum { DET_N_OUT = 10 };
static const char *const det_names[DET_N_OUT] = {
    "embedding_bwd", "rmsnorm_fwd", "rmsnorm_bwd dinp+dweight", "rope", "attention_fwd out+lse",
    "attention_bwd", "swiglu_bwd",  "xent",                     "adamw", "attention_decode"};

/* runs the ops on inputs drawn from `seed`; out[k] gets op k's results (det_len[k] floats) */
static void det_run(uint64_t seed, float *out[DET_N_OUT], size_t det_len[DET_N_OUT]) {
    rng_state = seed;
    const int B = 4, T = 33, nh = 6, nkv = 2, hdim = 16, C = 96, V = 67, F = 40;
    const int N = B * T;
    const size_t nq = (size_t)N * (nh + 2 * nkv) * hdim, no = (size_t)N * nh * hdim;
    int32_t *tok = xcalloc(N, sizeof(int32_t)), *tgt = xcalloc(N, sizeof(int32_t));
    for (int i = 0; i < N; i++) {
        tok[i] = rnd_int(V);
        tgt[i] = i % 11 == 0 ? -1 : rnd_int(V);
    }
    float *x = rnd_f((size_t)N * C, 1.0), *w = rnd_f(C, 1.0), *dy = rnd_f((size_t)N * C, 1.0);
    float *qkv = rnd_f(nq, 1.5), *dout = rnd_f(no, 1.0), *gu = rnd_f((size_t)N * 2 * F, 1.0);
    float *logits = rnd_f((size_t)N * V, 3.0), *g = rnd_f((size_t)N * C, 1.0);
    size_t len[DET_N_OUT] = {
        (size_t)V * C,     (size_t)N * C + N, (size_t)N * C + C, nq, no + (size_t)B * nh * T, nq,
        (size_t)N * 2 * F, (size_t)N * V + N, 3 * (size_t)N * C, (size_t)B * 2 * nh * hdim};
    for (int k = 0; k < DET_N_OUT; k++) {
        det_len[k] = len[k];
        out[k] = hf(len[k]);
    }
    ops->embedding_bwd(out[0], dy, tok, N, C);
    ops->rmsnorm_fwd(out[1], out[1] + (size_t)N * C, x, w, N, C, 1e-5f, NULL);
    ops->rmsnorm_bwd(out[2], out[2] + (size_t)N * C, dy, x, w, out[1] + (size_t)N * C, N, C);
    memcpy(out[3], qkv, nq * sizeof(float));
    const shlm_rope rope = rope_default(hdim, 10000.0);
    ops->rope(out[3], N, T, (nh + 2 * nkv) * hdim, nh + nkv, &rope, NULL, 0);
    ops->attention_fwd(out[4], out[4] + no, qkv, NULL, B, T, nh, nkv, hdim);
    ops->attention_bwd(out[5], dout, qkv, out[4], out[4] + no, NULL, B, T, nh, nkv, hdim, NULL);
    ops->swiglu_bwd(out[6], dy, gu, N, F, NULL); /* dout (N,F) fits inside dy (N,C) */
    ops->xent_fwd_bwd(out[7] + (size_t)N * V, out[7], logits, tgt, N, V, 0.01f);
    float *p = out[8], *m = p + (size_t)N * C, *v = m + (size_t)N * C;
    memcpy(p, x, (size_t)N * C * sizeof(float));
    ops->adamw(p, g, m, v, (size_t)N * C, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 1, NULL);
    /* two new tokens per row after caches of the first T tokens' k, v */
    const int cap = T + 2;
    float *kc = hf((size_t)B * nkv * cap * hdim), *vc = hf((size_t)B * nkv * cap * hdim);
    const int32_t zeros[4] = {0, 0, 0, 0}, pos[4] = {0, 9, T - 1, T};
    ops->kv_append(kc, vc, qkv, zeros, B, T, cap, nh, nkv, hdim);
    ops->attention_decode(out[9], kc, vc, qkv, pos, B, 2, cap, nh, nkv, hdim);
}

static void test_determinism(void) {
    if (!is_cpu) return;
    float *a[DET_N_OUT], *b[DET_N_OUT];
    size_t len[DET_N_OUT];
    char name[128];
    shlm_cpu_set_threads(1);
    det_run(99, a, len);
    shlm_cpu_set_threads(3); /* odd, so no chunk boundary coincides with the 1-thread run */
    det_run(99, b, len);
    for (int k = 0; k < DET_N_OUT; k++) {
        snprintf(name, sizeof name, "cpu: %s identical with 1 and 3 threads", det_names[k]);
        check_same(name, b[k], a[k], len[k]);
    }
    /* sum_squares over many blocks */
    size_t n = 3000017;
    float *x = rnd_f(n, 1.0);
    shlm_cpu_set_threads(1);
    double s1 = ops->sum_squares(x, n);
    shlm_cpu_set_threads(3);
    double s3 = ops->sum_squares(x, n);
    check_true("cpu: sum_squares identical with 1 and 3 threads", s1 == s3);
    /* bias_grad over more column blocks than threads */
    const int BN = 77, BC = 1001;
    float *g = rnd_f((size_t)BN * BC, 1.0), *db1 = hf(BC), *db3 = hf(BC);
    shlm_cpu_set_threads(1);
    ops->bias_grad(db1, g, BN, BC, 1);
    shlm_cpu_set_threads(3);
    ops->bias_grad(db3, g, BN, BC, 1);
    check_same("cpu: bias_grad identical with 1 and 3 threads", db3, db1, BC);
    /* matmul goes through OpenBLAS, whose blocking may follow the thread count: only
     * same-count repeatability is promised */
    const int M = 91, K = 37, OC = 29;
    float *xx = rnd_f((size_t)M * K, 1.0), *ww = rnd_f((size_t)OC * K, 1.0);
    float *y1 = hf((size_t)M * OC), *y2 = hf((size_t)M * OC);
    ops->matmul_fwd(y1, xx, ww, M, K, OC, NULL);
    ops->matmul_fwd(y2, xx, ww, M, K, OC, NULL);
    check_same("cpu: matmul_fwd repeatable with 3 threads", y2, y1, (size_t)M * OC);
    shlm_cpu_set_threads(1);
    release_all();
}

/* ---- fp8: the cast, the scaling rule and the scaled TN GEMM (ops.h "FP8") ----
 * The reference is written from the OCP definitions alone: each format's 256 codes
 * decoded from their bit fields in double, a value cast by scanning every code of its sign
 * for the nearest (a tie to the code with an even last bit), saturation to the largest
 * finite value and NaN to NaN; the scale from fp32 arithmetic as ops.h states it. */
typedef struct ref_fp8 {
    const char *name;
    shlm_fp8_format format;
    int ebits, mbits, bias;
    int ieee; /* E5M2: exponent all ones holds inf and NaN; E4M3: only S.1111.111 is NaN */
} ref_fp8;
static const ref_fp8 ref_e4m3 = {"e4m3", SHLM_FP8_E4M3, 4, 3, 7, 0};
static const ref_fp8 ref_e5m2 = {"e5m2", SHLM_FP8_E5M2, 5, 2, 15, 1};

static int ref_fp8_is_nan(const ref_fp8 *f, int code) {
    const int e = (code >> f->mbits) & ((1 << f->ebits) - 1), m = code & ((1 << f->mbits) - 1);
    const int emax = (1 << f->ebits) - 1;
    return f->ieee ? e == emax && m != 0 : e == emax && m == (1 << f->mbits) - 1;
}
/* the value of a code (NaN codes: NAN; E5M2's S.11111.00: ±inf) */
static double ref_fp8_value(const ref_fp8 *f, int code) {
    const int e = (code >> f->mbits) & ((1 << f->ebits) - 1), m = code & ((1 << f->mbits) - 1);
    const double sign = code & 0x80 ? -1.0 : 1.0;
    if (ref_fp8_is_nan(f, code)) return NAN;
    if (f->ieee && e == (1 << f->ebits) - 1) return sign * INFINITY;
    if (e == 0) return sign * m * pow(2.0, 1 - f->bias - f->mbits);
    return sign * (1.0 + m / (double)(1 << f->mbits)) * pow(2.0, e - f->bias);
}
static double ref_fp8_max(const ref_fp8 *f) {
    double m = 0;
    for (int c = 0; c < 128; c++) {
        double v = ref_fp8_value(f, c);
        if (isfinite(v) && v > m) m = v;
    }
    return m;
}
/* the code of x: NaN gives a NaN code (0x7F stands for any), beyond the largest finite
 * value (±inf included) the largest, else the nearest finite code of x's sign */
static int ref_fp8_cast(const ref_fp8 *f, double x) {
    if (isnan(x)) return 0x7F;
    const int sign = signbit(x) ? 0x80 : 0;
    const double fmax = ref_fp8_max(f), a = fmin(fabs(x), fmax);
    int best = -1;
    double best_d = INFINITY;
    for (int c = 0; c < 128; c++) {
        double v = ref_fp8_value(f, c);
        if (!isfinite(v)) continue;
        double d = fabs(v - a);
        if (d < best_d || (d == best_d && (c & 1) == 0)) {
            best = c;
            best_d = d;
        }
    }
    return sign | best;
}
/* codes equal, or both NaN codes of the format */
static int fp8_code_ok(const ref_fp8 *f, int got, int want) {
    return want == 0x7F && ref_fp8_is_nan(f, 0x7F) ? ref_fp8_is_nan(f, got) : got == want;
}

/* ops.h's scaling rule in the reference: the codes and scale_inv of q over src (an fp32
 * host matrix of rows x cols; transpose: src is cols x rows and q holds srcᵀ) */
static void ref_fp8_quantize(const ref_fp8 *f, int rowwise, const float *src, int rows, int cols,
                             int transpose, uint8_t *codes, float *scale_inv) {
    const float fmax = (float)ref_fp8_max(f);
    float amax_all = 0.0f;
    float *amax = hf((size_t)rows);
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < cols; k++) {
            float v = transpose ? src[(size_t)k * rows + r] : src[(size_t)r * cols + k];
            if (!isnan(v) && fabsf(v) > amax[r]) amax[r] = fabsf(v);
        }
    for (int r = 0; r < rows; r++) amax_all = amax[r] > amax_all ? amax[r] : amax_all;
    for (int r = 0; r < rows; r++) {
        float am = rowwise ? amax[r] : amax_all;
        float scale = fmax / (am > 1e-12f ? am : 1e-12f);
        if (rowwise || r == 0) scale_inv[rowwise ? r : 0] = 1.0f / scale;
        for (int k = 0; k < cols; k++) {
            float v = transpose ? src[(size_t)k * rows + r] : src[(size_t)r * cols + k];
            volatile float prod = v * scale; /* rounded to fp32, as the rule says */
            codes[(size_t)r * cols + k] = (uint8_t)ref_fp8_cast(f, prod);
        }
    }
}

/* A backend FP8 matrix of rows x cols (codes, scales in backend memory). */
static shlm_fp8_matrix fp8_dev(int rows, int cols, const ref_fp8 *f, int rowwise) {
    shlm_fp8_matrix q = {dalloc((size_t)rows * cols), dalloc((size_t)(rowwise ? rows : 1) * 4),
                         rows, cols, f->format, rowwise ? SHLM_FP8_ROWWISE : SHLM_FP8_TENSORWISE};
    return q;
}
static size_t fp8_scales(const shlm_fp8_matrix *q) {
    return q->scaling == SHLM_FP8_ROWWISE ? (size_t)q->rows : 1;
}

/* quantizes src (host fp32, act-representable) on the backend into q and checks the codes
 * and scale_inv against the reference, bit for bit; leaves q filled */
static void fp8_quantize_check(const char *what, const ref_fp8 *f, shlm_fp8_matrix *q,
                               const float *src, int transpose) {
    const size_t n = (size_t)q->rows * q->cols, ns = fp8_scales(q);
    const int rowwise = q->scaling == SHLM_FP8_ROWWISE;
    ops->fp8_quantize(q, up_act(src, n), transpose);
    uint8_t *got = xcalloc(n, 1), *want = xcalloc(n, 1);
    float *gs = hf(ns), *ws = hf(ns);
    ops->sync();
    ops->to_host(got, q->codes, n);
    ops->to_host(gs, q->scale_inv, ns * 4);
    ref_fp8_quantize(f, rowwise, src, q->rows, q->cols, transpose, want, ws);
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (!fp8_code_ok(f, got[i], want[i])) {
            if (first == n) first = i;
            bad++;
        }
    char name[200];
    snprintf(name, sizeof name, "fp8_quantize %s %s %s%s (%dx%d): codes", what, f->name,
             rowwise ? "rowwise" : "tensorwise", transpose ? " transposed" : "", q->rows, q->cols);
    if (bad)
        printf("     %zu codes differ; first at %zu: 0x%02X, want 0x%02X\n", bad, first,
               got[first], want[first]);
    check_true(name, bad == 0);
    snprintf(name, sizeof name, "fp8_quantize %s %s %s%s (%dx%d): scale_inv", what, f->name,
             rowwise ? "rowwise" : "tensorwise", transpose ? " transposed" : "", q->rows, q->cols);
    check_true(name, memcmp(gs, ws, ns * 4) == 0);
}

/* the act-dtype value next to x (finite, non-zero) towards zero (dir < 0) or away from it */
static float act_beside(float x, int dir) {
    if (ops->act_dtype != SHLM_BF16) return nextafterf(x, dir < 0 ? 0.0f : copysignf(INFINITY, x));
    uint16_t b = shlm_f32_to_bf16(x);
    return shlm_bf16_to_f32((uint16_t)(dir < 0 ? b - 1 : b + 1)); /* sign-magnitude bits */
}

/* The cast itself, with scale exactly 1 (the row's amax is the largest finite value):
 * every code's value, every midpoint of two neighbours (a tie: to the even code), the act
 * dtype's next value either side of it, half the smallest subnormal, zeros of both signs,
 * NaN. Every one is representable in the act dtype (fp8 midpoints have 5 significant
 * bits). */
static void fp8_cast_case(const ref_fp8 *f) {
    const double fmax = ref_fp8_max(f);
    float *v = hf(4096);
    int n = 0;
    v[n++] = (float)fmax;
    for (int sgn = 0; sgn < 2; sgn++) {
        double prev = 0.0;
        for (int c = 0; c < 128; c++) {
            double x = ref_fp8_value(f, c);
            if (!isfinite(x) || x == 0.0) continue; /* zeros: below */
            float mid = (float)((prev + x) / 2);
            float s = sgn ? -1.0f : 1.0f;
            v[n++] = s * (float)x;
            v[n++] = s * mid;
            v[n++] = s * act_beside(mid, -1);
            v[n++] = s * act_beside(mid, 1);
            prev = x;
        }
    }
    v[n++] = 0.0f;
    v[n++] = -0.0f;
    v[n++] = NAN;
    v[n++] = -NAN;
    shlm_fp8_matrix q = fp8_dev(1, n, f, 0);
    fp8_quantize_check("every code, tie, ulp beside ties, zeros, NaN", f, &q, v, 0);
    /* the reference's own sanity: ties go to even codes, the largest value is the spec's */
    check_true("fp8 reference: largest finite value 448 (e4m3) / 57344 (e5m2)",
               fmax == (f->format == SHLM_FP8_E4M3 ? 448.0 : 57344.0));
    check_true("fp8 reference: 1.0625 (e4m3 tie 1 | 1.125) -> 1; 1.1875 -> 1.25",
               f->format != SHLM_FP8_E4M3 ||
                   (ref_fp8_cast(f, 1.0625) == 0x38 && ref_fp8_cast(f, 1.1875) == 0x3A));
    check_true("fp8 reference: saturation (1e9, -inf) and NaN",
               ref_fp8_cast(f, 1e9) == ref_fp8_cast(f, fmax) &&
                   ref_fp8_cast(f, -INFINITY) == (0x80 | ref_fp8_cast(f, fmax)) &&
                   ref_fp8_is_nan(f, ref_fp8_cast(f, NAN)));
    release_all();
}

/* Rows that exercise amax and the scale: an all-zero row (amax clamped to 1e-12), a row
 * with NaN (ignored by amax), one with ±inf (scale 0: finite values to zero, inf to NaN),
 * fp32 subnormals, values near FLT_MAX; and the overflow case: values x whose product
 * with fl(fmax / x) rounds above fmax, which must saturate to the largest code (not
 * become NaN or inf). */
static void fp8_scale_case(const ref_fp8 *f) {
    enum { COLS = 9 };
    const float fmax = (float)ref_fp8_max(f);
    float rows[][COLS] = {
        {0, 0, -0.0f, 0, 0, 0, 0, 0, 0},
        {1.5f, NAN, -3.0f, 0.25f, NAN, 2.0f, -0.125f, 1e-3f, 7.0f},
        {1.0f, INFINITY, -2.0f, -INFINITY, 0.5f, 0, 3.0f, -1.0f, 4.0f},
        {1e-40f, -3e-39f, 2e-45f, 5e-39f, -1e-41f, 0, 7e-40f, 1e-39f, -2e-39f},
        {3e38f, -1e38f, 2.5e38f, 1e30f, -3.4e38f, 1e37f, 0, 1.0f, -5e37f},
        {0},
    };
    enum { ROWS = sizeof rows / sizeof rows[0] };
    act_round(&rows[0][0], (size_t)ROWS * COLS);
    /* the overflow row: values whose x · fl(fmax/x) > fmax in fp32 */
    int found = 0;
    for (int k = 0; k < 100000 && found < COLS; k++) {
        float x = (float)(0.5 + rnd_unif() * 1000.0);
        act_round(&x, 1);
        volatile float s = fmax / x, p = x * s;
        if (p > fmax) {
            rows[ROWS - 1][found] = found % 2 ? -x : x;
            found++;
        }
    }
    char name[160];
    snprintf(name, sizeof name, "fp8 overflow case: %d values with x * (fmax/x) > fmax in fp32 "
             "(%s)", found, f->name);
    check_true(name, found == COLS);
    for (int rowwise = 0; rowwise < 2; rowwise++) {
        for (int r = 0; r < ROWS; r++) { /* each row alone (tensorwise: its own amax) */
            shlm_fp8_matrix q = fp8_dev(1, COLS, f, rowwise);
            static const char *const what[ROWS] = {"zero row", "NaN row", "inf row",
                                                   "fp32 subnormals", "near FLT_MAX",
                                                   "overflow row"};
            fp8_quantize_check(what[r], f, &q, rows[r], 0);
        }
        /* all rows together: tensorwise takes one amax over them (inf: every code 0/NaN) */
        shlm_fp8_matrix q = fp8_dev(ROWS, COLS, f, rowwise);
        fp8_quantize_check("all special rows", f, &q, &rows[0][0], 0);
        release_all();
    }
    /* each overflow value alone in its row (rowwise: it is its row's amax): the largest
     * code, sign kept */
    shlm_fp8_matrix q = fp8_dev(COLS, 1, f, 1);
    fp8_quantize_check("overflow values, one a row", f, &q, rows[ROWS - 1], 0);
    uint8_t got[COLS];
    ops->to_host(got, q.codes, COLS);
    int sat = 0;
    for (int k = 0; k < COLS; k++)
        sat += (got[k] & 0x7F) == ref_fp8_cast(f, fmax) && (got[k] >> 7) == (rows[ROWS - 1][k] < 0);
    snprintf(name, sizeof name, "fp8 overflow case: each value saturates to ±%g, not NaN (%s)",
             (double)fmax, f->name);
    check_true(name, sat == COLS);
    release_all();
}

/* codes and scale_inv of a device matrix equal to want's (host codes, one scale) */
static int fp8_same_as(const shlm_fp8_matrix *d, const uint8_t *want, float want_scale) {
    const size_t n = (size_t)d->rows * d->cols;
    uint8_t *got = xcalloc(n, 1);
    float s;
    ops->sync();
    ops->to_host(got, d->codes, n);
    ops->to_host(&s, d->scale_inv, sizeof s);
    return memcmp(got, want, n) == 0 && memcmp(&s, &want_scale, sizeof s) == 0;
}

/* fp8_quantize_both with src_amax (tensorwise): given max |src| itself, the codes and scales
 * of q and qt (the amax computed) bit for bit; given twice it, the reference's codes at the
 * scale of that amax (so the given amax is what it uses, and src is not read for one). */
static void fp8_given_amax_check(const ref_fp8 *f, const shlm_fp8_matrix *q,
                                 const shlm_fp8_matrix *qt, const float *src) {
    const int R = q->rows, C = q->cols;
    const size_t n = (size_t)R * C;
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(src[i]));
    uint8_t *wq = xcalloc(n, 1), *wt = xcalloc(n, 1);
    float ws;
    ops->sync();
    ops->to_host(wq, q->codes, n);
    ops->to_host(wt, qt->codes, n);
    ops->to_host(&ws, q->scale_inv, sizeof ws);
    char name[200];
    for (int twice = 0; twice < 2; twice++) {
        const float given = twice ? 2.0f * amax : amax;
        shlm_fp8_matrix b = fp8_dev(R, C, f, 0), bt = fp8_dev(C, R, f, 0);
        ops->fp8_quantize_both(&b, &bt, up_act(src, n), up_f32(&given, 1));
        float scale = (float)ref_fp8_max(f) / fmaxf(given, 1e-12f), sinv = 1.0f / scale;
        if (twice) {
            for (int r = 0; r < R; r++)
                for (int c = 0; c < C; c++) {
                    const uint8_t code = (uint8_t)ref_fp8_cast(f, (double)(src[(size_t)r * C + c] * scale));
                    wq[(size_t)r * C + c] = code;
                    wt[(size_t)c * R + r] = code;
                }
        } else {
            sinv = ws;
        }
        snprintf(name, sizeof name, "fp8_quantize_both %s tensorwise (%dx%d) given %s: %s", f->name,
                 R, C, twice ? "2 max|src| as src_amax" : "max|src| as src_amax",
                 twice ? "the reference's codes and scale at that amax" : "the same codes and scales");
        check_true(name, fp8_same_as(&b, wq, sinv) && fp8_same_as(&bt, wt, sinv));
    }
}

/* fp8_quantize_both(src) writes what the two fp8_quantize calls wrote into q and qt (both
 * checked against the reference already), bit for bit: codes and scales. */
static void fp8_both_check(const ref_fp8 *f, const shlm_fp8_matrix *q, const shlm_fp8_matrix *qt,
                           const float *src) {
    const int rowwise = q->scaling == SHLM_FP8_ROWWISE;
    const size_t n = (size_t)q->rows * q->cols;
    shlm_fp8_matrix b = fp8_dev(q->rows, q->cols, f, rowwise);
    shlm_fp8_matrix bt = fp8_dev(q->cols, q->rows, f, rowwise);
    ops->fp8_quantize_both(&b, &bt, up_act(src, n), NULL);
    const shlm_fp8_matrix *want[] = {q, qt}, *got[] = {&b, &bt};
    int same = 1;
    for (int k = 0; k < 2; k++) {
        const size_t ns = fp8_scales(want[k]);
        uint8_t *wc = xcalloc(n, 1), *gc = xcalloc(n, 1);
        float *ws = hf(ns), *gs = hf(ns);
        ops->sync();
        ops->to_host(wc, want[k]->codes, n);
        ops->to_host(gc, got[k]->codes, n);
        ops->to_host(ws, want[k]->scale_inv, ns * sizeof(float));
        ops->to_host(gs, got[k]->scale_inv, ns * sizeof(float));
        same &= memcmp(wc, gc, n) == 0 && memcmp(ws, gs, ns * sizeof(float)) == 0;
    }
    char name[160];
    snprintf(name, sizeof name, "fp8_quantize_both %s %s (%dx%d) == fp8_quantize plain and "
             "transposed, bit for bit", f->name, rowwise ? "rowwise" : "tensorwise", q->rows, q->cols);
    check_true(name, same);
    if (!rowwise) fp8_given_amax_check(f, q, qt, src);
}

/* Random matrices of rows x cols: plain and transposed, both scalings; tensorwise, q(srcᵀ)
 * is bit for bit the transpose of q(src). scale_mix spreads the rows' magnitudes over
 * 2^-20 .. 2^20 so that rowwise scales differ. */
static void fp8_random_case(const ref_fp8 *f, int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    float *src = rnd_act(n, 1.0);
    for (int r = 0; r < rows; r++) {
        float mag = ldexpf(1.0f, rnd_int(41) - 20);
        for (int k = 0; k < cols; k++) src[(size_t)r * cols + k] *= mag;
    }
    act_round(src, n);
    for (int rowwise = 0; rowwise < 2; rowwise++) {
        shlm_fp8_matrix q = fp8_dev(rows, cols, f, rowwise), qt = fp8_dev(cols, rows, f, rowwise);
        fp8_quantize_check("random", f, &q, src, 0);
        fp8_quantize_check("random", f, &qt, src, 1);
        if (!rowwise) {
            uint8_t *a = xcalloc(n, 1), *b = xcalloc(n, 1);
            ops->to_host(a, q.codes, n);
            ops->to_host(b, qt.codes, n);
            int same = 1;
            for (int r = 0; r < rows; r++)
                for (int k = 0; k < cols; k++) same &= a[(size_t)r * cols + k] == b[(size_t)k * rows + r];
            char name[160];
            snprintf(name, sizeof name, "fp8_quantize tensorwise transposed == transpose of codes "
                     "(%s %dx%d)", f->name, rows, cols);
            check_true(name, same);
        }
        fp8_both_check(f, &q, &qt, src);
    }
    release_all();
}

/* Device backends: the rule is bit-exact between backends, so codes and scales of a
 * Llama-sized operand match the cpu's on the same (bf16) values. */
static void fp8_vs_cpu_case(const ref_fp8 *f, int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    float *src = rnd_act(n, 3.0);
    for (int rowwise = 0; rowwise < 2; rowwise++)
        for (int transpose = 0; transpose < 2; transpose++) {
            const int qr = transpose ? cols : rows, qc = transpose ? rows : cols;
            shlm_fp8_matrix q = fp8_dev(qr, qc, f, rowwise);
            ops->fp8_quantize(&q, up_act(src, n), transpose);
            shlm_fp8_matrix c = {xcalloc(n, 1), hf((size_t)qr), qr, qc, f->format, q.scaling};
            cpu->fp8_quantize(&c, src, transpose);
            uint8_t *got = xcalloc(n, 1);
            float *gs = hf((size_t)qr);
            ops->sync();
            ops->to_host(got, q.codes, n);
            ops->to_host(gs, q.scale_inv, fp8_scales(&q) * 4);
            char name[160];
            snprintf(name, sizeof name, "fp8_quantize %s %s%s (%dx%d) bit for bit the cpu's", f->name,
                     rowwise ? "rowwise" : "tensorwise", transpose ? " transposed" : "", qr, qc);
            check_true(name, memcmp(got, c.codes, n) == 0 && memcmp(gs, c.scale_inv, fp8_scales(&q) * 4) == 0);
        }
    release_all();
}

/* The reference product of two quantized matrices held on the backend: out(M,N) =
 * Σ_k dec(a)·dec(b) · sa · sb (+ c), in double from the codes the backend wrote. */
static double *ref_fp8_gemm(const shlm_fp8_matrix *a, const ref_fp8 *fa, const shlm_fp8_matrix *b,
                            const ref_fp8 *fb, const float *c) {
    const int M = a->rows, N = b->rows, K = a->cols;
    uint8_t *ca = xcalloc((size_t)M * K, 1), *cb = xcalloc((size_t)N * K, 1);
    float *sa = hf(fp8_scales(a)), *sb = hf(fp8_scales(b));
    ops->sync();
    ops->to_host(ca, a->codes, (size_t)M * K);
    ops->to_host(cb, b->codes, (size_t)N * K);
    ops->to_host(sa, a->scale_inv, fp8_scales(a) * 4);
    ops->to_host(sb, b->scale_inv, fp8_scales(b) * 4);
    double va[256], vb[256];
    for (int k = 0; k < 256; k++) va[k] = ref_fp8_value(fa, k), vb[k] = ref_fp8_value(fb, k);
    const int rw = a->scaling == SHLM_FP8_ROWWISE;
    double *out = hd((size_t)M * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += va[ca[(size_t)i * K + k]] * vb[cb[(size_t)j * K + k]];
            out[(size_t)i * N + j] = s * sa[rw ? i : 0] * sb[rw ? j : 0] + (c ? c[(size_t)i * N + j] : 0);
        }
    return out;
}

/* out = q(a)·q(b)ᵀ written (=) into a NaN-filled out, then added (+=, c aliasing out) to
 * out = init, each against the reference on the backend's codes; flags: matmul_fp8's
 * (SHLM_FP8_OUT_F32: out fp32, else act) */
static void fp8_gemm_set_add(const char *form, const shlm_fp8_matrix *a, const ref_fp8 *fa,
                             const shlm_fp8_matrix *b, const ref_fp8 *fb, int flags,
                             const float *init, const char *tag, tol_id t) {
    const size_t n = (size_t)a->rows * b->rows;
    const int f32 = flags & SHLM_FP8_OUT_F32;
    char name[200];
    double *want = ref_fp8_gemm(a, fa, b, fb, NULL);
    void *d = f32 ? (void *)nan_f32_dev(n) : nan_act(n);
    ops->matmul_fp8(d, flags, a, b, NULL);
    snprintf(name, sizeof name, "matmul_fp8 %s (=) %s", form, tag);
    check_close(name, f32 ? got_f32(d, n) : got_act(d, n), want, n, t);
    want = ref_fp8_gemm(a, fa, b, fb, init);
    d = f32 ? up_f32(init, n) : up_act(init, n);
    ops->matmul_fp8(d, flags, a, b, d);
    snprintf(name, sizeof name, "matmul_fp8 %s (+=) %s", form, tag);
    check_close(name, f32 ? got_f32(d, n) : got_act(d, n), want, n, t);
}

/* Every GEMM of a block's linear y = x·Wᵀ (x N x C, W OC x C) in a recipe: G the
 * gradients' format. Forward: = and with a separate residual and with the residual
 * aliasing out; dgrad (act out) = and +=; wgrad (fp32 out) = and +=. The operands are
 * quantized by the backend (checked above); the reference multiplies the codes it wrote. */
static void fp8_gemm_case(int N, int C, int OC, int rowwise, const ref_fp8 *G) {
    char tag[96], name[200];
    snprintf(tag, sizeof tag, "(N=%d C=%d OC=%d %s, grads %s)", N, C, OC,
             rowwise ? "rowwise" : "tensorwise", G->name);
    const ref_fp8 *E = &ref_e4m3;
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float *x = rnd_act(nx, 1.0), *w = rnd_act(nw, 0.2), *dy = rnd_act(ny, 1e-3);
    float *res = rnd_act(ny, 1.0), *dx0 = rnd_act(nx, 1e-3), *dw0 = rnd_f(nw, 1e-3);
    void *d_x = up_act(x, nx), *d_w = up_act(w, nw), *d_dy = up_act(dy, ny);
    const tol_id t_act = T_FP8_ACT, t_f32 = T_FP8_F32;

    /* forward: y = q(x)·q(W)ᵀ (+ residual) */
    shlm_fp8_matrix qx = fp8_dev(N, C, E, rowwise), qw = fp8_dev(OC, C, E, rowwise);
    ops->fp8_quantize(&qx, d_x, 0);
    ops->fp8_quantize(&qw, d_w, 0);
    double *want = ref_fp8_gemm(&qx, E, &qw, E, NULL);
    void *d_y = nan_act(ny);
    ops->matmul_fp8(d_y, 0, &qx, &qw, NULL);
    snprintf(name, sizeof name, "matmul_fp8 fwd (=) %s", tag);
    check_close(name, got_act(d_y, ny), want, ny, t_act);
    want = ref_fp8_gemm(&qx, E, &qw, E, res);
    void *d_res = up_act(res, ny);
    d_y = nan_act(ny);
    ops->matmul_fp8(d_y, 0, &qx, &qw, d_res);
    snprintf(name, sizeof name, "matmul_fp8 fwd (= product + separate residual) %s", tag);
    check_close(name, got_act(d_y, ny), want, ny, t_act);
    snprintf(name, sizeof name, "matmul_fp8 fwd residual input unchanged %s", tag);
    check_same(name, got_act(d_res, ny), res, ny);
    d_y = up_act(res, ny);
    ops->matmul_fp8(d_y, 0, &qx, &qw, d_y);
    snprintf(name, sizeof name, "matmul_fp8 fwd (+=, residual aliases out) %s", tag);
    check_close(name, got_act(d_y, ny), want, ny, t_act);
    if (!rowwise) { /* scales 4 bytes past a 16-byte boundary (cuBLASLt refuses those) */
        float s[2];
        ops->sync();
        ops->to_host(&s[0], qx.scale_inv, sizeof(float));
        ops->to_host(&s[1], qw.scale_inv, sizeof(float));
        float *d_s = up_f32((const float[]){0.0f, s[0], 0.0f, 0.0f, 0.0f, s[1]}, 6);
        shlm_fp8_matrix ux = qx, uw = qw;
        ux.scale_inv = d_s + 1, uw.scale_inv = d_s + 5;
        d_y = nan_act(ny);
        ops->matmul_fp8(d_y, 0, &ux, &uw, d_res);
        snprintf(name, sizeof name, "matmul_fp8 fwd, scale pointers not 16-byte aligned %s", tag);
        check_close(name, got_act(d_y, ny), want, ny, t_act);
    }

    /* dgrad: dx = q(dy, G)·q(Wᵀ)ᵀ */
    shlm_fp8_matrix qdy = fp8_dev(N, OC, G, rowwise), qwt = fp8_dev(C, OC, E, rowwise);
    ops->fp8_quantize(&qdy, d_dy, 0);
    ops->fp8_quantize(&qwt, d_w, 1);
    fp8_gemm_set_add("dgrad", &qdy, G, &qwt, E, 0, dx0, tag, t_act);

    /* wgrad: dW = q(dyᵀ, G)·q(xᵀ)ᵀ, fp32 out */
    shlm_fp8_matrix qdyt = fp8_dev(OC, N, G, rowwise), qxt = fp8_dev(C, N, E, rowwise);
    ops->fp8_quantize(&qdyt, d_dy, 1);
    ops->fp8_quantize(&qxt, d_x, 1);
    fp8_gemm_set_add("wgrad fp32", &qdyt, G, &qxt, E, SHLM_FP8_OUT_F32, dw0, tag, t_f32);
    release_all();
}

/* ---- FP8 weights from fp32 parameters (fp8_param_amax, _scale, _cast) and fp8_transpose ---- */

/* n fp32 values of mixed sign over 2^-8..2^8 (most not bf16-representable), a NaN at n/3
 * and, last (in a scalar tail at most offsets), the largest magnitude, negative */
static float *param_values(size_t n) {
    float *h = hf(n);
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        h[i] = (float)(rnd_normal() * ldexp(1.0, rnd_int(17) - 8));
        m = fmaxf(m, fabsf(h[i]));
    }
    if (n >= 2) h[n - 1] = -1.375f * m;
    if (n >= 3) h[n / 3] = NAN;
    return h;
}
/* h (n fp32) on the backend, `off` elements into a buffer whose other elements are ±1e30:
 * an op that reads outside [p, p + n) sees a larger |x| */
static float *up_param(const float *h, size_t n, int off) {
    const size_t len = n + (size_t)off + 5;
    float *g = hf(len);
    for (size_t i = 0; i < len; i++) g[i] = i & 1 ? -1e30f : 1e30f;
    memcpy(g + off, h, n * sizeof(float));
    return (float *)up_f32(g, len) + off;
}
/* max |h[i]| over [lo, hi), NaN ignored */
static float host_amax(const float *h, size_t lo, size_t hi) {
    float m = 0.0f;
    for (size_t i = lo; i < hi; i++)
        if (!isnan(h[i])) m = fmaxf(m, fabsf(h[i]));
    return m;
}
static float down_scalar(const float *d) {
    float v;
    down_f32(&v, d, 1);
    return v;
}
/* a byte buffer of `pad` + n + 16 bytes filled with 0xA5, returned `pad` bytes in; guard_ok
 * says whether the bytes around [p, p + n) still hold it */
static uint8_t *up_guarded(size_t n, int pad) {
    const size_t len = n + (size_t)pad + 16;
    uint8_t *g = xcalloc(len, 1);
    memset(g, 0xA5, len);
    uint8_t *d = dalloc(len);
    ops->to_device(d, g, len);
    return d + pad;
}
static int guard_ok(const uint8_t *d, size_t n, int pad, uint8_t *inner) {
    const size_t len = n + (size_t)pad + 16;
    uint8_t *g = xcalloc(len, 1);
    ops->sync();
    ops->to_host(g, d - pad, len);
    memcpy(inner, g + pad, n);
    int ok = 1;
    for (size_t i = 0; i < len; i++)
        if (i < (size_t)pad || i >= (size_t)pad + n) ok &= g[i] == 0xA5;
    return ok;
}

/* fp8_param_amax over p + off (n values): the host maximum, into *amax = 0, into a
 * smaller and a larger start (the max accumulates, the start is not overwritten), and over
 * two calls on the halves */
static void fp8_param_amax_case(size_t n, int off) {
    const float *h = param_values(n);
    float *d = up_param(h, n, off);
    const float want = host_amax(h, 0, n);
    const float starts[3] = {0.0f, 0.5f * want, 2.0f * want};
    char name[160];
    for (int s = 0; s < 3; s++) {
        float *amax = up_f32(&starts[s], 1);
        ops->fp8_param_amax(amax, d, n);
        const float got = down_scalar(amax), w = fmaxf(starts[s], want);
        snprintf(name, sizeof name, "fp8_param_amax n=%zu at +%d, *amax from %g: %g (want %g)", n,
                 off, (double)starts[s], (double)got, (double)w);
        check_true(name, memcmp(&got, &w, sizeof w) == 0);
    }
    const size_t half = n / 2;
    const float zero = 0.0f;
    float *amax = up_f32(&zero, 1);
    ops->fp8_param_amax(amax, d, half);
    const float got_lo = down_scalar(amax);
    ops->fp8_param_amax(amax, d + half, n - half);
    const float got = down_scalar(amax), w_lo = host_amax(h, 0, half);
    snprintf(name, sizeof name, "fp8_param_amax n=%zu at +%d over two halves: %g then %g (want "
             "%g, %g)", n, off, (double)got_lo, (double)got, (double)w_lo, (double)want);
    check_true(name, memcmp(&got_lo, &w_lo, sizeof w_lo) == 0 && memcmp(&got, &want, sizeof want) == 0);
    release_all();
}

/* amax, scale and cast of h (n fp32) at p + p_off into codes + c_off: codes and scale_inv
 * against the reference's tensorwise e4m3 quantization of x = bf16(h) (round) or h, and
 * where the act dtype holds x exactly (round, or fp32 act), bit for bit against the
 * backend's own fp8_quantize of x as a 1 x n act matrix; no byte around the codes
 * written */
static void fp8_param_cast_check(const char *what, const float *h, size_t n, int p_off, int c_off,
                                 int round) {
    float *d = up_param(h, n, p_off);
    const float zero = 0.0f;
    float *amax = up_f32(&zero, 1), *sinv = nan_f32_dev(1);
    uint8_t *codes = up_guarded(n, c_off);
    ops->fp8_param_amax(amax, d, n);
    ops->fp8_param_scale(sinv, amax, round);
    ops->fp8_param_cast(codes, d, n, amax, round);
    uint8_t *got = xcalloc(n, 1), *want = xcalloc(n, 1);
    const int guards = guard_ok(codes, n, c_off, got);
    const float gs = down_scalar(sinv);
    float *x = dup_f(h, n), ws;
    if (round)
        for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
    ref_fp8_quantize(&ref_e4m3, 0, x, 1, (int)n, 0, want, &ws);
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (!fp8_code_ok(&ref_e4m3, got[i], want[i]) && !bad++) first = i;
    if (bad)
        printf("     %zu codes differ; first at %zu (x %a): 0x%02X, want 0x%02X\n", bad, first,
               (double)x[first], got[first], want[first]);
    char name[200];
    snprintf(name, sizeof name, "fp8_param_cast %s n=%zu p+%d codes+%d round_bf16=%d: codes, "
             "scale_inv (%a, want %a) as the reference's, guards intact", what, n, p_off, c_off,
             round, (double)gs, (double)ws);
    check_true(name, bad == 0 && memcmp(&gs, &ws, sizeof ws) == 0 && guards);
    if (round || ops->act_dtype == SHLM_F32) {
        shlm_fp8_matrix q = fp8_dev(1, (int)n, &ref_e4m3, 0);
        ops->fp8_quantize(&q, up_act(x, n), 0);
        uint8_t *qc = xcalloc(n, 1);
        float qs;
        ops->sync();
        ops->to_host(qc, q.codes, n);
        ops->to_host(&qs, q.scale_inv, sizeof qs);
        snprintf(name, sizeof name, "fp8_param_cast %s n=%zu p+%d codes+%d round_bf16=%d: bit for "
                 "bit fp8_quantize e4m3 tensorwise", what, n, p_off, c_off, round);
        check_true(name, memcmp(qc, got, n) == 0 && memcmp(&qs, &gs, sizeof qs) == 0);
    }
}
static void fp8_param_cast_case(size_t n, int p_off, int c_off) {
    const float *h = param_values(n);
    for (int round = 0; round < 2; round++) fp8_param_cast_check("random", h, n, p_off, c_off, round);
    release_all();
}
/* zeros only (amax clamped to 1e-12), fp32 subnormals, and a value whose bf16 rounding is
 * inf (round_bf16: amax inf, scale 0, that value's code NaN and the rest zero) */
static void fp8_param_edge_case(void) {
    const float zeros[5] = {0.0f, -0.0f, 0.0f, -0.0f, 0.0f};
    const float small[7] = {1e-40f, -3e-39f, 2e-45f, 0.0f, -1e-41f, 7e-40f, -2e-39f};
    const float big[6] = {3.4e38f, -1.0f, 2.0f, NAN, -3e38f, 1e-3f};
    for (int round = 0; round < 2; round++) {
        fp8_param_cast_check("zeros", zeros, 5, 1, 0, round);
        fp8_param_cast_check("subnormals", small, 7, 0, 3, round);
        fp8_param_cast_check("near FLT_MAX", big, 6, 2, 2, round);
    }
    release_all();
}
/* Device backends on a large operand: codes, scale_inv and amax bit for bit the cpu's */
static void fp8_param_vs_cpu_case(size_t n, int off) {
    const float *h = param_values(n);
    float *d = up_param(h, n, off);
    for (int round = 0; round < 2; round++) {
        const float zero = 0.0f;
        float *amax = up_f32(&zero, 1), *sinv = nan_f32_dev(1);
        uint8_t *codes = (uint8_t *)dalloc(n + (size_t)off) + off;
        ops->fp8_param_amax(amax, d, n);
        ops->fp8_param_scale(sinv, amax, round);
        ops->fp8_param_cast(codes, d, n, amax, round);
        float camax = 0.0f, csinv;
        uint8_t *cc = xcalloc(n, 1), *got = xcalloc(n, 1);
        cpu->fp8_param_amax(&camax, h, n);
        cpu->fp8_param_scale(&csinv, &camax, round);
        cpu->fp8_param_cast(cc, h, n, &camax, round);
        const float ga = down_scalar(amax), gs = down_scalar(sinv);
        ops->to_host(got, codes, n);
        char name[160];
        snprintf(name, sizeof name, "fp8_param_* n=%zu at +%d round_bf16=%d: amax, scale_inv and "
                 "codes bit for bit the cpu's", n, off, round);
        check_true(name, memcmp(&ga, &camax, 4) == 0 && memcmp(&gs, &csinv, 4) == 0 &&
                             memcmp(got, cc, n) == 0);
    }
    release_all();
}

/* fp8_transpose of random bytes, src at +src_off and dst at +dst_off in their buffers,
 * against the host transpose; no byte around dst written */
static void fp8_transpose_case(int rows, int cols, int src_off, int dst_off) {
    const size_t n = (size_t)rows * cols;
    uint8_t *h = xcalloc(n, 1), *got = xcalloc(n, 1);
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)rnd_u64();
    uint8_t *src = (uint8_t *)dalloc(n + (size_t)src_off) + src_off;
    ops->to_device(src, h, n);
    uint8_t *dst = up_guarded(n, dst_off);
    ops->fp8_transpose(dst, src, rows, cols);
    const int guards = guard_ok(dst, n, dst_off, got);
    size_t bad = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) bad += got[(size_t)c * rows + r] != h[(size_t)r * cols + c];
    char name[160];
    snprintf(name, sizeof name, "fp8_transpose %dx%d src+%d dst+%d: the host transpose (%zu bytes "
             "differ), guards intact", rows, cols, src_off, dst_off, bad);
    check_true(name, bad == 0 && guards);
    release_all();
}

static void test_fp8_params(void) {
    if (!ops->fp8_param_amax || !ops->fp8_param_scale || !ops->fp8_param_cast || !ops->fp8_transpose) {
        check_true("fp8: the backend has fp8_param_amax, fp8_param_scale, fp8_param_cast and "
                   "fp8_transpose", 0);
        return;
    }
    static const struct { size_t n; int p_off, c_off; } cast[] = {
        {1, 0, 0},    {2, 1, 1},    {1000, 0, 0}, {1001, 3, 3},
        {1001, 1, 2}, {4099, 2, 2}, {4099, 2, 0}, {1961, 0, 1}};
    for (size_t k = 0; k < sizeof cast / sizeof cast[0]; k++) {
        fp8_param_amax_case(cast[k].n, cast[k].p_off);
        fp8_param_cast_case(cast[k].n, cast[k].p_off, cast[k].c_off);
    }
    fp8_param_amax_case(100003, 3);
    fp8_param_edge_case();
    if (!is_cpu && !small_only) fp8_param_vs_cpu_case((size_t)512 * 4096 + 3, 1);
    static const int tr[][4] = {{1, 1, 0, 0},       {37, 53, 0, 0},   {64, 64, 0, 0},
                                {300, 264, 0, 0},   {129, 4097, 0, 0}, {256, 384, 0, 0},
                                {256, 384, 1, 3},   {300, 264, 3, 5},  {4097, 129, 0, 0},
                                {16, 16, 0, 0},     {1, 1000, 0, 0},   {1000, 1, 0, 0}};
    for (size_t k = 0; k < sizeof tr / sizeof tr[0]; k++)
        fp8_transpose_case(tr[k][0], tr[k][1], tr[k][2], tr[k][3]);
    if (!is_cpu && !small_only) fp8_transpose_case(4096, 11008, 0, 0);
}

static void test_fp8(void) {
    if (!ops->fp8_check || !ops->fp8_quantize || !ops->matmul_fp8) {
        printf("# backend %s has no FP8 members: fp8 group skipped\n", ops->name);
        return;
    }
    char why[256] = "";
    if (ops->fp8_check(why, sizeof why) != 0) {
        printf("# backend %s cannot run FP8 here (%s): fp8 group skipped\n", ops->name, why);
        return;
    }
    if (is_cpu) check_true("fp8: the cpu backend always runs FP8 (emulated)", 1);
    const ref_fp8 *fmts[2] = {&ref_e4m3, &ref_e5m2};
    for (int k = 0; k < 2; k++) {
        fp8_cast_case(fmts[k]);
        fp8_scale_case(fmts[k]);
        fp8_random_case(fmts[k], 37, 53);
        fp8_random_case(fmts[k], 1, 1);
        fp8_random_case(fmts[k], 64, 128);
        fp8_random_case(fmts[k], 300, 264);
        if (!is_cpu && !small_only) fp8_vs_cpu_case(fmts[k], 512, 4096);
    }
    /* the recipes' formats (tensorwise: e5m2 gradients; rowwise: e4m3), and each other
     * pairing, on shapes whose every K and leading dimension is a multiple of 16 (cuBLASLt's
     * FP8 condition) and on odd ones */
    static const int shapes[][3] = {{64, 128, 96}, {37, 53, 29}, {1, 3, 2}, {48, 16, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        fp8_gemm_case(shapes[s][0], shapes[s][1], shapes[s][2], 0, &ref_e5m2);
        fp8_gemm_case(shapes[s][0], shapes[s][1], shapes[s][2], 1, &ref_e4m3);
    }
    fp8_gemm_case(64, 128, 96, 0, &ref_e4m3);
    fp8_gemm_case(37, 53, 29, 1, &ref_e5m2);
    if (!is_cpu && !small_only) fp8_gemm_case(256, 1024, 768, 0, &ref_e5m2);
    test_fp8_params();
}

/* ---- nf4: the NF4 format of kernels/nf4.h (ops.h "NF4") ----
 * nf4_dequantize against a reference that reads the format as kernels/nf4.h states it (the
 * nibble order, the block and group of each value, the two-step scale of double quant), on
 * arbitrary bytes (every level and every dynamic-map code) and on the quantizer's own output,
 * over whole tensors and regions. And, once (on the cpu run: it is host code), the quantizer
 * against NF4's definition: each value's level a nearest one to x / absmax, a value on a
 * midpoint going to the lower level, absmax the block's largest |x|, the padding nibble, the
 * double-quant statistics; bitsandbytes' own codes are tests/nf4_ref.sh's. */

/* an NF4 tensor's arrays on the host (xcalloc), plain or double quant */
static shlm_nf4 nf4_host(size_t n, int dq) {
    shlm_nf4 h = {n, xcalloc(shlm_nf4_code_bytes(n) + 1, 1), NULL, NULL, NULL, NULL};
    if (dq) {
        h.absmax_codes = xcalloc(shlm_nf4_blocks(n) + 1, 1);
        h.absmax2 = hf(shlm_nf4_groups(n) + 1);
        h.offset = hf(1);
    } else {
        h.absmax = hf(shlm_nf4_blocks(n) + 1);
    }
    return h;
}

/* random bytes and scales: every level and every dynamic-map code appears in a large one */
static shlm_nf4 nf4_random(size_t n, int dq) {
    shlm_nf4 h = nf4_host(n, dq);
    for (size_t k = 0; k < shlm_nf4_code_bytes(n); k++) h.codes[k] = (uint8_t)(rnd_u64() >> 56);
    for (size_t b = 0; b < shlm_nf4_blocks(n); b++) {
        if (dq) h.absmax_codes[b] = (uint8_t)(rnd_u64() >> 56);
        else h.absmax[b] = (float)fabs(rnd_normal()) * 0.05f;
    }
    if (dq) {
        for (size_t g = 0; g < shlm_nf4_groups(n); g++) h.absmax2[g] = (float)(0.01 * rnd_unif());
        h.offset[0] = 0.02f;
    }
    return h;
}

/* h's arrays copied to the backend, the codes `codes_off` bytes into their allocation (odd:
 * not 16-byte aligned) */
static shlm_nf4 nf4_up(const shlm_nf4 *h, int codes_off) {
    const size_t nc = shlm_nf4_code_bytes(h->n), nb = shlm_nf4_blocks(h->n);
    shlm_nf4 d = {h->n, (uint8_t *)dalloc(nc + (size_t)codes_off + 1) + codes_off, NULL, NULL,
                  NULL, NULL};
    ops->to_device(d.codes, h->codes, nc);
    if (h->absmax) {
        d.absmax = up_f32(h->absmax, nb);
    } else {
        d.absmax_codes = dalloc(nb + 1);
        ops->to_device(d.absmax_codes, h->absmax_codes, nb);
        d.absmax2 = up_f32(h->absmax2, shlm_nf4_groups(h->n));
        d.offset = up_f32(h->offset, 1);
    }
    return d;
}

/* The reference: value i of h as kernels/nf4.h defines it, each product and sum rounded to
 * fp32 on its own (volatile: no fused multiply-add). */
static float ref_nf4_value(const shlm_nf4 *h, size_t i) {
    const int c = i % 2 ? h->codes[i / 2] & 15 : h->codes[i / 2] >> 4;
    const size_t b = i / 64;
    float a;
    if (h->absmax) {
        a = h->absmax[b];
    } else {
        volatile float p = shlm_nf4_dq_code[h->absmax_codes[b]] * h->absmax2[b / 256];
        a = p + h->offset[0];
    }
    volatile float v = shlm_nf4_code[c] * a;
    return v;
}

enum { NF4_GUARD = 16 };

/* nf4_dequantize of [begin, end) of d (h on the host) into an act buffer of NaN whose
 * region starts `out_off` elements past a 16-byte boundary: the reference's values rounded
 * to the act dtype, bit for bit, and the NF4_GUARD elements either side still NaN */
static void nf4_region_check(const char *what, const shlm_nf4 *h, const shlm_nf4 *d, size_t begin,
                             size_t end, int out_off) {
    const size_t n = end - begin, len = n + 2 * NF4_GUARD + (size_t)out_off;
    void *buf = nan_act(len);
    ops->nf4_dequantize(act_at(buf, NF4_GUARD + (size_t)out_off), d, begin, end);
    float *got = got_act(buf, len), *want = hf(n);
    for (size_t i = 0; i < n; i++) want[i] = ref_nf4_value(h, begin + i);
    act_round(want, n);
    int guards = 1;
    for (size_t i = 0; i < len; i++)
        if (i < NF4_GUARD + (size_t)out_off || i >= NF4_GUARD + (size_t)out_off + n) guards &= isnan(got[i]);
    const float *g = got + NF4_GUARD + out_off;
    double err = max_rel_err(g, dup_d(want, n), n);
    if (err == 0.0 && memcmp(g, want, n * sizeof(float)) != 0) err = 1e-300; /* -0 vs +0 */
    if (!guards) err = NAN;
    char name[200];
    snprintf(name, sizeof name, "nf4_dequantize %s n=%zu %s [%zu, %zu) out+%d: the format's values, "
             "guards intact", what, h->n, h->absmax ? "plain" : "double quant", begin, end, out_off);
    report(name, err, T_NF4);
}

static void nf4_dequant_random_case(size_t n, int dq) {
    shlm_nf4 h = nf4_random(n, dq);
    shlm_nf4 d = nf4_up(&h, 0), du = nf4_up(&h, 1);
    nf4_region_check("random bytes", &h, &d, 0, n, 0);
    nf4_region_check("random bytes", &h, &d, 0, n, 1);
    nf4_region_check("random bytes, codes at +1 byte", &h, &du, 0, n, 0);
    /* regions starting on later blocks (and groups), ending anywhere, empty ones */
    const size_t nb = shlm_nf4_blocks(n);
    const size_t starts[] = {64, 64 * (nb / 2), 64 * (nb - 1), 64 * 257};
    for (size_t s = 0; s < sizeof starts / sizeof starts[0]; s++) {
        const size_t b = starts[s];
        if (b > n) continue;
        nf4_region_check("random bytes", &h, &d, b, n, 0);
        if (n - b > 3) nf4_region_check("random bytes", &h, &d, b, n - 3, 1);
        nf4_region_check("random bytes, codes at +1 byte", &h, &du, b, b + (n - b) / 2, 0);
    }
    nf4_region_check("random bytes, empty", &h, &d, 0, 0, 0);
    release_all();
}

/* the cpu's fp32 values through round_to_bf16 are the bf16 values (ops.h: a bf16 gather) */
static void nf4_bf16_emulation_case(size_t n, int dq) {
    shlm_nf4 h = nf4_random(n, dq), d = nf4_up(&h, 0);
    float *out = hf(n), *want = hf(n);
    ops->nf4_dequantize(out, &d, 0, n);
    ops->round_to_bf16(out, n);
    for (size_t i = 0; i < n; i++) want[i] = bf16_round(ref_nf4_value(&h, i));
    char name[160];
    snprintf(name, sizeof name, "nf4_dequantize then round_to_bf16 (cpu) n=%zu %s: bf16 of the "
             "format's values, a bf16 backend's", n, dq ? "double quant" : "plain");
    check_same(name, out, want, n);
    release_all();
}

/* a region that does not start on a block, or reaches past the tensor, aborts (cpu) */
static void nf4_bad_region_case(void) {
    shlm_nf4 h = nf4_random(200, 0), d = nf4_up(&h, 0);
    float *out = hf(200);
    const size_t bad[3][2] = {{32, 100}, {64, 201}, {128, 64}};
    for (int k = 0; k < 3; k++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            if (!freopen("/dev/null", "w", stderr)) _exit(2);
            ops->nf4_dequantize(out, &d, bad[k][0], bad[k][1]);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        char name[120];
        snprintf(name, sizeof name, "nf4_dequantize cpu: region [%zu, %zu) of 200 values aborts",
                 bad[k][0], bad[k][1]);
        check_true(name, WIFEXITED(st) && WEXITSTATUS(st) == 1);
    }
    release_all();
}

/* ---- the host quantizer against NF4's definition (cpu run) ---- */

/* the quantizer's fp32 midpoints of neighbouring levels */
static float nf4_mid(int k) {
    volatile float s = shlm_nf4_code[k] + shlm_nf4_code[k + 1];
    return s / 2.0f;
}

/* x (n fp32, or bf16 bits in xb) quantized plain: every absmax the block's largest |x|
 * (partial last block: at least 1e-38), every level a nearest one to x / absmax (in double;
 * where x / absmax lies within 2^-20 of a midpoint the fp32 scaling may tip it either way),
 * and the odd padding nibble 7 (the level 0) */
static void nf4_quantize_check(const char *what, const float *x, const uint16_t *xb, size_t n) {
    shlm_nf4 q = nf4_host(n, 0);
    size_t bad = 0;
    const int rc = xb ? shlm_nf4_quantize_bf16(&q, xb, &bad) : shlm_nf4_quantize(&q, x, &bad);
    size_t wrong_absmax = 0, wrong_code = 0, first = n;
    for (size_t b = 0; b < shlm_nf4_blocks(n); b++) {
        const size_t lo = b * 64, hi = lo + 64 < n ? lo + 64 : n;
        float am = 0.0f;
        for (size_t i = lo; i < hi; i++) am = fmaxf(am, fabsf(x[i]));
        if (hi - lo < 64) am = fmaxf(am, 1e-38f);
        wrong_absmax += memcmp(&am, &q.absmax[b], sizeof am) != 0;
        for (size_t i = lo; i < hi; i++) {
            const double s = (double)x[i] / fmax(am, 1e-38);
            const int c = i % 2 ? q.codes[i / 2] & 15 : q.codes[i / 2] >> 4;
            const double dc = fabs(s - shlm_nf4_code[c]);
            int nearest = 1;
            for (int k = 0; k < 16; k++) {
                const double dk = fabs(s - shlm_nf4_code[k]);
                if (dk < dc && dc - dk > 0x1p-19) nearest = 0;
            }
            if (!nearest && !wrong_code++) first = i;
        }
    }
    const int pad_ok = n % 2 == 0 || (q.codes[n / 2] & 15) == 7;
    if (wrong_code)
        printf("     %zu levels not nearest; first at %zu (x %a, absmax %a, byte 0x%02X)\n",
               wrong_code, first, (double)x[first], (double)q.absmax[first / 64], q.codes[first / 2]);
    char name[200];
    snprintf(name, sizeof name, "nf4 quantize %s n=%zu%s: absmax the block's max |x|, each level "
             "a nearest one, padding nibble 7", what, n, xb ? " (bf16 input)" : "");
    check_true(name, rc == 0 && wrong_absmax == 0 && wrong_code == 0 && pad_ok);
}

/* a block whose absmax is 1 (so x / absmax is x exactly) holding every midpoint and the
 * floats either side: bucketize(right=False), the lower level on a midpoint */
static void nf4_tie_case(void) {
    float x[64] = {1.0f};
    int want[64] = {15}, n = 1;
    for (int k = 0; k < 15; k++) {
        const float m = nf4_mid(k);
        x[n] = m, want[n++] = k;
        x[n] = nextafterf(m, 2.0f), want[n++] = k + 1;
        x[n] = nextafterf(m, -2.0f), want[n++] = k;
    }
    while (n < 64) x[n] = 0.0f, want[n++] = 7;
    shlm_nf4 q = nf4_host(64, 0);
    size_t bad;
    int ok = shlm_nf4_quantize(&q, x, &bad) == 0;
    for (int i = 0; i < 64; i++) ok &= (i % 2 ? q.codes[i / 2] & 15 : q.codes[i / 2] >> 4) == want[i];
    check_true("nf4 quantize: a value on a midpoint takes the lower level, the next float up "
               "the upper one", ok);
    const float order[4] = {-1.0f, 1.0f, 0.0f, 0.5f};
    shlm_nf4 p = nf4_host(4, 0);
    ok = shlm_nf4_quantize(&p, order, &bad) == 0;
    check_true("nf4 quantize: value 0 in the high nibble of byte 0, value 1 in the low one "
               "({-1, 1} -> 0x0F)", ok && p.codes[0] == 0x0F && p.codes[1] >> 4 == 7);
    release_all();
}

/* double quant against plain quantization of the same x: the same codes, offset the mean of
 * the plain absmaxes (to fp32 summation error), absmax2 each group's max |absmax - offset|,
 * each absmax back within the dynamic map's resolution (its widest gap, 0.9/64, halved, plus
 * the 2/65535 of its 65536 bins: 0.0075 · absmax2) */
static void nf4_dq_check(const char *what, const float *x, size_t n) {
    shlm_nf4 p = nf4_host(n, 0), q = nf4_host(n, 1);
    size_t bad;
    int ok = shlm_nf4_quantize(&p, x, &bad) == 0 && shlm_nf4_quantize(&q, x, &bad) == 0;
    ok &= memcmp(p.codes, q.codes, shlm_nf4_code_bytes(n)) == 0;
    const size_t nb = shlm_nf4_blocks(n);
    double mean = 0.0;
    for (size_t b = 0; b < nb; b++) mean += p.absmax[b];
    mean /= (double)nb;
    const float off = q.offset[0];
    const int mean_ok = fabs(off - mean) <= 1e-6 * fabs(mean) + 1e-30;
    size_t a2_bad = 0, far = 0;
    for (size_t g = 0; g < shlm_nf4_groups(n); g++) {
        float a2 = 0.0f;
        for (size_t b = g * 256; b < nb && b < g * 256 + 256; b++) a2 = fmaxf(a2, fabsf(p.absmax[b] - off));
        a2_bad += memcmp(&a2, &q.absmax2[g], sizeof a2) != 0;
        for (size_t b = g * 256; b < nb && b < g * 256 + 256; b++) {
            volatile float pr = shlm_nf4_dq_code[q.absmax_codes[b]] * q.absmax2[g];
            const float a = pr + off;
            far += fabsf(a - p.absmax[b]) > 0.0075f * a2;
        }
    }
    char name[200];
    snprintf(name, sizeof name, "nf4 quantize double quant %s n=%zu: plain's codes, offset %g the "
             "mean (%g), absmax2 each group's max |absmax - offset|, absmaxes within 0.0075 "
             "absmax2 (%zu beyond)", what, n, (double)off, mean, far);
    check_true(name, ok && mean_ok && a2_bad == 0 && far == 0);
}

static void nf4_quantizer_cases(void) {
    check_true("nf4 levels: 16 ascending from -1 to 1, 0 at index 7",
               shlm_nf4_code[0] == -1.0f && shlm_nf4_code[7] == 0.0f && shlm_nf4_code[15] == 1.0f);
    int asc = 1;
    for (int k = 0; k < 15; k++) asc &= shlm_nf4_code[k] < shlm_nf4_code[k + 1];
    for (int k = 0; k < 255; k++) asc &= shlm_nf4_dq_code[k] < shlm_nf4_dq_code[k + 1];
    check_true("nf4 code books strictly ascending; the dynamic map ends at 1", asc &&
               shlm_nf4_dq_code[255] == 1.0f);
    static const size_t sizes[] = {1, 2, 63, 64, 65, 1000, 1001, 64 * 300 + 17, 64 * 256 * 3};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const size_t n = sizes[s];
        float *x = rnd_f(n, 0.02), *xr = hf(n);
        uint16_t *xb = xcalloc(n, sizeof(uint16_t));
        for (size_t i = 0; i < n; i++) xb[i] = shlm_f32_to_bf16(x[i]), xr[i] = shlm_bf16_to_f32(xb[i]);
        nf4_quantize_check("normal", x, NULL, n);
        nf4_quantize_check("normal", xr, xb, n);
        nf4_dq_check("normal", x, n);
        release_all();
    }
    /* zeros: whole zero blocks (absmax 0, every level 7) and a zero partial last block
     * (absmax 1e-38); tiny values below 1e-38; an outlier */
    const size_t n = 64 * 5 + 10;
    float *x = rnd_f(n, 1.0);
    for (size_t i = 64; i < 192; i++) x[i] = 0.0f;
    for (size_t i = 320; i < n; i++) x[i] = 0.0f;
    nf4_quantize_check("zero blocks", x, NULL, n);
    nf4_dq_check("zero blocks", x, n);
    for (size_t i = 0; i < 64; i++) x[i] = (float)(1e-40 * rnd_normal());
    x[200] = 3e4f;
    nf4_quantize_check("subnormals and an outlier", x, NULL, n);
    nf4_dq_check("subnormals and an outlier", x, n);
    /* every block's absmax 1: offset 1, absmax2 0, codes 0, the absmaxes back to 1 */
    float *ones = rnd_f(64 * 300, 0.1);
    for (size_t b = 0; b < 300; b++) ones[b * 64 + b % 64] = b % 2 ? 1.0f : -1.0f;
    shlm_nf4 q = nf4_host(64 * 300, 1);
    size_t bad;
    int ok = shlm_nf4_quantize(&q, ones, &bad) == 0 && q.offset[0] == 1.0f && q.absmax2[0] == 0.0f &&
             q.absmax2[1] == 0.0f;
    for (size_t b = 0; b < 300; b++) ok &= q.absmax_codes[b] == 0;
    check_true("nf4 quantize double quant: equal absmaxes give offset 1, absmax2 0, codes 0", ok);
    nf4_tie_case();
    /* NaN and infinity refused, naming the first; nothing at all to do for n = 0 */
    for (int k = 0; k < 2; k++) {
        float *y = rnd_f(300, 1.0);
        y[150] = k ? INFINITY : NAN;
        y[299] = NAN;
        shlm_nf4 p = nf4_host(300, k);
        bad = 0;
        const int rc = shlm_nf4_quantize(&p, y, &bad);
        check_true(k ? "nf4 quantize: an infinity is refused, its index returned"
                     : "nf4 quantize: a NaN is refused, its index returned", rc == -1 && bad == 150);
    }
    shlm_nf4 e = nf4_host(0, 1);
    check_true("nf4 quantize: n = 0 returns 0", shlm_nf4_quantize(&e, x, &bad) == 0);
    /* the same bytes with 1 and 3 threads */
    const size_t nt = 64 * 256 * 20 + 33;
    float *big = rnd_f(nt, 0.02);
    shlm_nf4 t1 = nf4_host(nt, 1), t3 = nf4_host(nt, 1);
    shlm_cpu_set_threads(1);
    ok = shlm_nf4_quantize(&t1, big, &bad) == 0;
    shlm_cpu_set_threads(3);
    ok &= shlm_nf4_quantize(&t3, big, &bad) == 0;
    shlm_cpu_set_threads(1);
    const size_t nb = shlm_nf4_blocks(nt);
    ok &= memcmp(t1.codes, t3.codes, shlm_nf4_code_bytes(nt)) == 0 &&
          memcmp(t1.absmax_codes, t3.absmax_codes, nb) == 0 &&
          memcmp(t1.absmax2, t3.absmax2, shlm_nf4_groups(nt) * sizeof(float)) == 0 &&
          memcmp(t1.offset, t3.offset, sizeof(float)) == 0;
    check_true("nf4 quantize double quant: identical bytes with 1 and 3 threads", ok);
    release_all();
}

/* the quantizer's own output, dequantized whole and by regions that meet on block edges */
static void nf4_quantized_case(size_t n, int dq) {
    float *x = rnd_f(n, 0.02);
    shlm_nf4 h = nf4_host(n, dq);
    size_t bad;
    check_true("nf4 quantize of normal values returns 0", shlm_nf4_quantize(&h, x, &bad) == 0);
    shlm_nf4 d = nf4_up(&h, 0);
    nf4_region_check("quantized", &h, &d, 0, n, 0);
    const size_t cut = 64 * (shlm_nf4_blocks(n) / 3);
    nf4_region_check("quantized", &h, &d, 0, cut, 0);
    nf4_region_check("quantized", &h, &d, cut, n, 0);
    release_all();
}

static void test_nf4(void) {
    if (!ops->nf4_dequantize) {
        check_true("nf4: the backend has nf4_dequantize", 0);
        return;
    }
    static const size_t sizes[] = {1, 2, 31, 63, 64, 65, 1000, 1001, 64 * 256 * 2 + 64 * 3 + 31};
    for (int dq = 0; dq < 2; dq++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) nf4_dequant_random_case(sizes[s], dq);
        nf4_quantized_case(64 * 300 + 17, dq);
        if (!is_cpu && !small_only) nf4_dequant_random_case((size_t)4096 * 4096 + 64 * 5 + 7, dq);
        if (is_cpu) nf4_bf16_emulation_case(64 * 256 + 65, dq);
    }
    if (is_cpu) {
        nf4_bad_region_case();
        nf4_quantizer_cases();
    }
}

/* ====================================================================================
 * main */
static const struct group {
    const char *name;
    void (*run)(void);
} groups[] = {
    {"backends", test_backends},   {"memory", test_memory},       {"convert", test_convert},
    {"embedding", test_embedding}, {"rmsnorm", test_rmsnorm},     {"matmul", test_matmul},
    {"bias", test_bias},           {"rope", test_rope},           {"attention", test_attention},
    {"swiglu", test_swiglu},       {"decode", test_decode},       {"xent", test_xent},
    {"adamw", test_adamw_all},     {"reductions", test_reductions},
    {"determinism", test_determinism}, {"fp8", test_fp8},         {"nf4", test_nf4},
};
enum { N_GROUPS = sizeof groups / sizeof groups[0] };

static int usage(const char *msg) {
    fprintf(stderr, "test_ops: %s\nusage: test_ops [--backend NAME] [--seed N] [--group NAME] "
                    "[--small]\ngroups:", msg);
    for (int k = 0; k < N_GROUPS; k++) fprintf(stderr, " %s", groups[k].name);
    fprintf(stderr, "\n");
    return 2;
}

int main(int argc, char **argv) {
    const char *backend = "cpu", *only = NULL;
    uint64_t seed = 20240601u;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--small") == 0) {
            small_only = 1;
            continue;
        }
        if (strcmp(a, "--backend") && strcmp(a, "--seed") && strcmp(a, "--group"))
            return usage("unknown argument");
        if (!v) return usage("an option lacks its value");
        i++;
        if (strcmp(a, "--backend") == 0) backend = v;
        else if (strcmp(a, "--group") == 0) only = v;
        else {
            char *end;
            seed = strtoull(v, &end, 10);
            if (*end || !*v) return usage("--seed takes a non-negative integer");
        }
    }
    int found = only == NULL;
    for (int k = 0; k < N_GROUPS && !found; k++) found = strcmp(groups[k].name, only) == 0;
    if (!found) return usage("no such group");

    /* the thread counts are part of the reproduction: name them when they were set */
    const char *omp = getenv("OMP_NUM_THREADS"), *blas = getenv("OPENBLAS_NUM_THREADS");
    printf("# reproduce:%s%s%s%s %s --backend %s --seed %" PRIu64 "%s%s%s\n",
           omp ? " OMP_NUM_THREADS=" : "", omp ? omp : "", blas ? " OPENBLAS_NUM_THREADS=" : "",
           blas ? blas : "", argv[0], backend, seed, only ? " --group " : "", only ? only : "",
           small_only ? " --small" : "");
    ops = shlm_ops_find(backend);
    if (ops == NULL) {
        fprintf(stderr, "test_ops: backend '%s' is not built in\n", backend);
        return 2;
    }
    if (!ops->available()) return check_skip("backend %s is not available on this machine", backend);
    if (ops->set_device) ops->set_device(0); /* bind first, as a training rank does */
    is_cpu = ops == &shlm_ops_cpu;
    shlm_device_info info;
    const int have_info = ops->device_info && ops->device_info(&info) == 0;
    printf("# backend %s, act dtype %s%s%s\n", ops->name, shlm_dtype_name(ops->act_dtype),
           have_info ? ", device 0: " : "", have_info ? info.name : "");
    printf("# maxrel = max|a-b|/max|b|, rel_l2 = |a-b|_2/|b|_2; tol 0: the same values. "
           "Tolerances:\n");
    for (int k = 0; k < T_COUNT; k++)
        printf("#   %-22s %-6s %.0e  %s\n", tol_table[k].name,
               tol_table[k].crit == CRIT_L2 ? "rel_l2" : "maxrel", tol_of(k), tol_table[k].why);
    rng_state = seed;

    for (int k = 0; k < N_GROUPS; k++) {
        if (only && strcmp(groups[k].name, only) != 0) continue;
        groups[k].run();
        release_all();
    }
    ops->sync();
    return check_exit();
}
