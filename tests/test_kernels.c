/* Unit test of a compute backend's ops table (the cpu backend by default): every op,
 * forward and backward, against naive double-precision references written here. */

/* Usage: test_kernels [backend [seed]]
 *
 * Criterion, per output tensor: max_i |a_i - b_i| / max(max_i |b_i|, 1e-30) < tol, where a
 * is the backend's result and b the double reference computed from the same (fp32)
 * inputs. tol = 1e-5 for fp32 activations (2e-2 when a backend keeps activations in
 * bf16, whose outputs carry 8 significant bits); a tol of 0 means bit-identical. The
 * references' own backward passes are checked against central finite differences of
 * their forward passes (same measure over the gradient, tol 1e-6, a dozen random
 * coordinates each), so a wrong reference cannot make a wrong kernel pass.
 * Every check prints one line; the exit status is 0 when all pass, 1 otherwise. */
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
#include "tests/doc_layout.h"

#define TOL_F32 1e-5
#define TOL_BF16 2e-2
#define TOL_FD 1e-6
#define FD_COORDS 12

static const shlm_ops *ops;
static int is_cpu;     /* cpu-only properties (thread invariance, documented aliasing) */
static double tol_act; /* tolerance of results computed from act tensors */
static int n_checks, n_failed;

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
 * release_all() when the test ends, so the tests read as straight-line code */
enum { MAX_LIVE = 1024 };
static void *live_host[MAX_LIVE], *live_dev[MAX_LIVE];
static int n_live_host, n_live_dev;

static void *remember(void **list, int *n, void *p) {
    if (*n == MAX_LIVE) {
        fprintf(stderr, "test_kernels: more than %d live buffers\n", MAX_LIVE);
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
        fprintf(stderr, "test_kernels: out of memory\n");
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

static float bf16_round(float x) { return shlm_bf16_to_f32(shlm_f32_to_bf16(x)); }

/* fp32 tensor ~ N(0, scale²) */
static float *rnd_f(size_t n, double scale) {
    float *a = hf(n);
    for (size_t i = 0; i < n; i++) a[i] = (float)(scale * rnd_normal());
    return a;
}
/* act tensor: as rnd_f, but representable in the backend's act dtype, so that the
 * reference sees exactly what the backend sees */
static float *rnd_act(size_t n, double scale) {
    float *a = rnd_f(n, scale);
    if (ops->act_dtype == SHLM_BF16)
        for (size_t i = 0; i < n; i++) a[i] = bf16_round(a[i]);
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

/* ------------------------------------------------------------------------------------
 * backend buffers: everything goes through the table, so other backends can run this */
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
static void *up_act(const float *h, size_t n) {
    if (ops->act_dtype == SHLM_F32) return up_f32(h, n);
    void *d = dalloc(n * shlm_dtype_size(ops->act_dtype));
    float *tmp = ops->alloc(n * sizeof(float));
    ops->to_device(tmp, h, n * sizeof(float));
    ops->f32_to_act(d, tmp, n);
    ops->sync();
    ops->free(tmp);
    return d;
}
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

/* ------------------------------------------------------------------------------------
 * checks */
static double max_rel_err(const float *a, const double *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) return NAN;
        if (d > num) num = d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

static int report(const char *name, double err, double tol) {
    int ok = tol > 0 ? err < tol : err == 0.0; /* NaN fails both */
    n_checks++;
    if (!ok) n_failed++;
    printf("%s %-62s max_rel_err %.2e  tol %.0e\n", ok ? "ok  " : "FAIL", name, err, tol);
    fflush(stdout);
    return ok;
}

static int check_close(const char *name, const float *a, const double *b, size_t n, double tol) {
    return report(name, max_rel_err(a, b, n), tol);
}

/* bit-identical float tensors; the printed error is their max relative difference */
static int check_same(const char *name, const float *a, const float *b, size_t n) {
    double *bd = dup_d(b, n);
    double err = memcmp(a, b, n * sizeof(float)) == 0 ? 0.0 : max_rel_err(a, bd, n);
    if (err == 0.0 && memcmp(a, b, n * sizeof(float)) != 0) err = 1e-300; /* e.g. -0 vs +0 */
    return report(name, err, 0.0);
}

/* a yes/no property: printed as error 0 (holds) or 1 (does not) */
static int check_true(const char *name, int cond) { return report(name, cond ? 0.0 : 1.0, 0.0); }

/* The reference gradient `grad` of loss() w.r.t. x (n elements) against central
 * differences at FD_COORDS random coordinates, relative to max|grad|. */
typedef double (*loss_fn)(void *ctx);
static void check_fd(const char *name, loss_fn loss, void *ctx, double *x, size_t n,
                     const double *grad) {
    double gmax = 0.0, err = 0.0;
    for (size_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(grad[i]));
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
    report(buf, err / (gmax > 1e-30 ? gmax : 1e-30), TOL_FD);
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

/* angle of pair i at position pos: pos / theta^(2i/hd) */
static double ref_rope_angle(int pos, int i, int hd, double theta) {
    return pos * exp(-(2.0 * i / hd) * log(theta));
}
/* out = rope(x); elements outside the first n_heads heads are copied */
static void ref_rope_fwd(double *out, const double *x, int N, int T, int stride, int n_heads,
                         int hd, double theta) {
    int half = hd / 2;
    memcpy(out, x, (size_t)N * stride * sizeof(double));
    for (int r = 0; r < N; r++)
        for (int h = 0; h < n_heads; h++)
            for (int i = 0; i < half; i++) {
                size_t a = (size_t)r * stride + (size_t)h * hd + i, b = a + half;
                double th = ref_rope_angle(r % T, i, hd, theta);
                out[a] = x[a] * cos(th) - x[b] * sin(th);
                out[b] = x[b] * cos(th) + x[a] * sin(th);
            }
}
/* dx = Jᵀ dout, the transpose of the forward's 2×2 blocks */
static void ref_rope_bwd(double *dx, const double *dout, int N, int T, int stride, int n_heads,
                         int hd, double theta) {
    int half = hd / 2;
    memcpy(dx, dout, (size_t)N * stride * sizeof(double));
    for (int r = 0; r < N; r++)
        for (int h = 0; h < n_heads; h++)
            for (int i = 0; i < half; i++) {
                size_t a = (size_t)r * stride + (size_t)h * hd + i, b = a + half;
                double th = ref_rope_angle(r % T, i, hd, theta);
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
            double v = 0.0;
            for (int d = 0; d < s.hd; d++) v += qkv[QI(s, b, i, h, d)] * qkv[KI(s, b, j, kh, d)];
            const int seen = ref_sees(doc, s, b, i, j);
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
                    for (int j = 0; j < s.T; j++)
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
                for (int j = 0; j < s.T; j++) {
                    double v = 0.0;
                    for (int d = 0; d < s.hd; d++)
                        v += dout[OI(s, b, i, h, d)] * qkv[VI(s, b, j, kh, d)];
                    dP[(size_t)i * s.T + j] = v;
                }
            for (int i = 0; i < s.T; i++) {
                double rs = 0.0;
                for (int j = 0; j < s.T; j++)
                    rs += P[(size_t)i * s.T + j] * dP[(size_t)i * s.T + j];
                for (int j = 0; j < s.T; j++) {
                    double p = P[(size_t)i * s.T + j], dS = p * (dP[(size_t)i * s.T + j] - rs);
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
              ops->attention_fwd && ops->attention_bwd && ops->swiglu_fwd && ops->swiglu_bwd &&
              ops->xent_fwd_bwd && ops->adamw && ops->sum_squares &&
              ops->f32_to_bf16 && ops->bf16_to_f32 && ops->accumulate;
    check_true("backends: every member of the table is set", all);
    check_true("backends: available() is 1", ops->available() == 1);
    if (is_cpu) check_true("backends: cpu act dtype is fp32", ops->act_dtype == SHLM_F32);
}

static void test_memory(void) {
    const size_t sizes[] = {0, 1, 3, 64, 1000, 1u << 20};
    int zeroed = 1, aligned = 1, roundtrip = 1, zero_ok = 1;
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

static void test_convert(void) {
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

    /* the backend's round_to_bf16 equals f32 -> bf16 -> f32, bit for bit */
    size_t n = 4099;
    float *x = rnd_f(n, 10.0), *want = hf(n), *got = hf(n);
    x[0] = bits_f32(0x3F808000u);
    x[1] = bits_f32(0x3F818000u);
    x[2] = INFINITY;
    x[3] = -INFINITY;
    x[4] = bits_f32(0x7F7FFFFFu);
    x[5] = -0.0f;
    x[6] = 1e-40f;
    for (size_t i = 0; i < n; i++) want[i] = bf16_round(x[i]);
    float *d = up_f32(x, n);
    ops->round_to_bf16(d, n);
    down_f32(got, d, n);
    check_same("bf16: round_to_bf16 == bf16_to_f32(f32_to_bf16(x))", got, want, n);
    float nanv = NAN;
    ops->to_device(d, &nanv, sizeof nanv);
    ops->round_to_bf16(d, 1);
    down_f32(got, d, 1);
    check_true("bf16: round_to_bf16 keeps NaN", isnan(got[0]));

    /* f32_to_bf16 / bf16_to_f32 on backend buffers: the same bits as the scalar helper */
    uint16_t *bits = ops->alloc(n * sizeof(uint16_t)), *hbits = malloc(n * sizeof(uint16_t));
    ops->to_device(d, x, n * sizeof(float));
    ops->f32_to_bf16(bits, d, n);
    ops->to_host(hbits, bits, n * sizeof(uint16_t));
    int bad_bits = 0;
    for (size_t i = 0; i < n; i++) bad_bits += hbits[i] != shlm_f32_to_bf16(x[i]);
    check_true("bf16: f32_to_bf16 == scalar round-to-nearest-even, every element", bad_bits == 0);
    ops->bf16_to_f32(d, bits, n);
    down_f32(got, d, n);
    check_same("bf16: bf16_to_f32(f32_to_bf16(x)) == round_to_bf16(x)", got, want, n);
    ops->free(bits);
    free(hbits);

    /* f32 -> act -> f32: a copy for fp32 activations, bf16 rounding otherwise */
    void *act = ops->alloc(n * shlm_dtype_size(ops->act_dtype));
    ops->to_device(d, x, n * sizeof(float));
    ops->f32_to_act(act, d, n);
    down_act(got, act, n);
    check_same("convert: f32_to_act(x) read back", got, ops->act_dtype == SHLM_F32 ? x : want, n);
    ops->free(act);
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

static void test_embedding(void) {
    const int N = 7 * 13, C = 37, V = 17; /* V < N: tokens repeat, as the scatter must handle */
    int32_t *tok = xcalloc(N, sizeof(int32_t));
    for (int i = 0; i < N; i++) tok[i] = rnd_int(V);
    tok[0] = tok[1] = tok[N - 1] = V - 1;
    float *wte = rnd_act((size_t)V * C, 1.0), *dout = rnd_act((size_t)N * C, 1.0);
    float *dwte0 = rnd_f((size_t)V * C, 1.0), *got = hf((size_t)V * C + (size_t)N * C);
    double *ref = hd((size_t)N * C), *dref = dup_d(dwte0, (size_t)V * C);

    void *d_tok = up_i32(tok, N), *d_wte = up_act(wte, (size_t)V * C);
    float *junk = rnd_act((size_t)N * C, 1e3);
    void *d_out = up_act(junk, (size_t)N * C), *d_dout = up_act(dout, (size_t)N * C);
    float *d_dwte = up_f32(dwte0, (size_t)V * C);

    emb_ctx c = {dup_d(wte, (size_t)V * C), dup_d(dout, (size_t)N * C), ref, tok, N, C};
    ops->embedding_fwd(d_out, d_tok, d_wte, N, C);
    down_act(got, d_out, (size_t)N * C);
    ref_embedding_fwd(ref, tok, c.wte, N, C);
    check_close("embedding_fwd out (=)", got, ref, (size_t)N * C, tol_act);

    ops->embedding_bwd(d_dwte, d_dout, d_tok, N, C);
    down_f32(got, d_dwte, (size_t)V * C);
    ref_embedding_bwd(dref, c.dout, tok, N, C);
    check_close("embedding_bwd dwte (+=, repeated tokens)", got, dref, (size_t)V * C, tol_act);

    double *g = hd((size_t)V * C);
    ref_embedding_bwd(g, c.dout, tok, N, C);
    check_fd("embedding dwte", emb_loss, &c, c.wte, (size_t)V * C, g);
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

static void test_rmsnorm(void) {
    const int N = 7 * 13, C = 37;
    const float eps = 1e-5f;
    const size_t n = (size_t)N * C;
    float *x = rnd_act(n, 1.0), *w = rnd_act(C, 0.3), *dout = rnd_act(n, 1.0);
    for (int c = 0; c < C; c++) w[c] += 1.0f;
    if (ops->act_dtype == SHLM_BF16)
        for (int c = 0; c < C; c++) w[c] = bf16_round(w[c]);
    /* one row small enough that eps matters (mean square ~1e-6 against eps 1e-5) */
    for (int c = 0; c < C; c++) x[3 * C + c] *= 1e-3f;
    float *dx0 = rnd_act(n, 1.0), *dw0 = rnd_f(C, 1.0), *got = hf(n);
    double *ref = hd(n), *rstd = hd(N), *rdx = dup_d(dx0, n), *rdw = dup_d(dw0, C);
    rms_ctx c = {dup_d(x, n), dup_d(w, C), dup_d(dout, n), hd(n), N, C, eps};

    void *d_x = up_act(x, n), *d_w = up_act(w, C), *d_dout = up_act(dout, n);
    void *d_out = up_act(dx0, n), *d_dx = up_act(dx0, n);
    float *d_rstd = dalloc(N * sizeof(float)), *d_dw = up_f32(dw0, C);

    ops->rmsnorm_fwd(d_out, d_rstd, d_x, d_w, N, C, eps);
    ref_rmsnorm_fwd(ref, rstd, c.x, c.w, N, C, eps);
    down_act(got, d_out, n);
    check_close("rmsnorm_fwd out (=)", got, ref, n, tol_act);
    down_f32(got, d_rstd, N);
    check_close("rmsnorm_fwd rstd", got, rstd, N, tol_act);

    ops->rmsnorm_bwd(d_dx, d_dw, d_dout, d_x, d_w, d_rstd, N, C);
    ref_rmsnorm_bwd(rdx, rdw, c.dout, c.x, c.w, N, C, eps);
    down_act(got, d_dx, n);
    check_close("rmsnorm_bwd dinp (+=)", got, rdx, n, tol_act);
    down_f32(got, d_dw, C);
    check_close("rmsnorm_bwd dweight (+=)", got, rdw, C, tol_act);

    double *gx = hd(n), *gw = hd(C);
    ref_rmsnorm_bwd(gx, gw, c.dout, c.x, c.w, N, C, eps);
    check_fd("rmsnorm dinp", rms_loss, &c, c.x, n, gx);
    check_fd("rmsnorm dweight", rms_loss, &c, c.w, C, gw);

    if (is_cpu) { /* documented in cpu.h: dinp may alias dout */
        float *buf = dup_f(dout, n), *dw = dup_f(dw0, C);
        double *want = hd(n), *wdw = dup_d(dw0, C);
        for (size_t i = 0; i < n; i++) want[i] = dout[i];
        ref_rmsnorm_bwd(want, wdw, c.dout, c.x, c.w, N, C, eps);
        ops->rmsnorm_bwd(buf, dw, buf, x, w, (float *)d_rstd, N, C);
        check_close("rmsnorm_bwd cpu: dinp aliasing dout", buf, want, n, tol_act);
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

static void test_matmul(void) {
    const int N = 7 * 13, C = 37, OC = 29;
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float *x = rnd_act(nx, 1.0), *w = rnd_act(nw, 0.2), *dout = rnd_act(ny, 1.0);
    float *y0 = rnd_act(ny, 1.0), *dx0 = rnd_act(nx, 1.0), *dw0 = rnd_f(nw, 1.0);
    float *got = hf(nx + nw + ny);
    mm_ctx c = {dup_d(x, nx), dup_d(w, nw), dup_d(dout, ny), hd(ny), N, C, OC};
    double *ref = hd(ny);
    void *d_x = up_act(x, nx), *d_w = up_act(w, nw), *d_dout = up_act(dout, ny);
    void *d_y = up_act(y0, ny), *d_dx = up_act(dx0, nx);
    float *d_dw = up_f32(dw0, nw);

    ops->matmul_fwd(d_y, d_x, d_w, N, C, OC, NULL);
    ref_matmul_fwd(ref, c.x, c.w, N, C, OC);
    down_act(got, d_y, ny);
    check_close("matmul_fwd out (=, no residual)", got, ref, ny, tol_act);

    /* a separate residual: out = product + residual, the residual left as it was */
    void *d_res = up_act(y0, ny);
    d_y = up_act(y0, ny);
    ops->zero(d_y, ny * shlm_dtype_size(ops->act_dtype)); /* anything: it is overwritten */
    ops->matmul_fwd(d_y, d_x, d_w, N, C, OC, d_res);
    for (size_t i = 0; i < ny; i++) ref[i] += y0[i];
    down_act(got, d_y, ny);
    check_close("matmul_fwd out (= product + separate residual)", got, ref, ny, tol_act);
    down_act(got, d_res, ny);
    check_same("matmul_fwd residual input unchanged", got, y0, ny);

    d_y = up_act(y0, ny);
    ops->matmul_fwd(d_y, d_x, d_w, N, C, OC, d_y);
    down_act(got, d_y, ny);
    check_close("matmul_fwd out (+=, residual aliases out)", got, ref, ny, tol_act);

    double *rdx = dup_d(dx0, nx), *rdw = dup_d(dw0, nw);
    ops->matmul_bwd(d_dx, d_dw, d_dout, d_x, d_w, N, C, OC, 0);
    ref_matmul_bwd(rdx, rdw, c.dout, c.x, c.w, N, C, OC);
    down_act(got, d_dx, nx);
    check_close("matmul_bwd dinp (+=)", got, rdx, nx, tol_act);
    down_f32(got, d_dw, nw);
    check_close("matmul_bwd dweight (+=)", got, rdw, nw, tol_act);

    /* NULL skips that product and leaves the other buffer alone */
    ops->matmul_bwd(NULL, d_dw, d_dout, d_x, d_w, N, C, OC, 0);
    ref_matmul_bwd(NULL, rdw, c.dout, c.x, c.w, N, C, OC);
    down_f32(got, d_dw, nw);
    check_close("matmul_bwd dinp NULL: dweight (+=)", got, rdw, nw, tol_act);
    ops->matmul_bwd(d_dx, NULL, d_dout, d_x, d_w, N, C, OC, 0);
    ref_matmul_bwd(rdx, NULL, c.dout, c.x, c.w, N, C, OC);
    down_act(got, d_dx, nx);
    check_close("matmul_bwd dweight NULL: dinp (+=)", got, rdx, nx, tol_act);

    /* "=" flags: whatever the outputs held (here the sums above) is replaced */
    double *sdx = hd(nx), *sdw = hd(nw);
    ref_matmul_bwd(sdx, sdw, c.dout, c.x, c.w, N, C, OC);
    ops->matmul_bwd(d_dx, d_dw, d_dout, d_x, d_w, N, C, OC, SHLM_MM_SET_DINP);
    down_act(got, d_dx, nx);
    check_close("matmul_bwd dinp (=, SET_DINP)", got, sdx, nx, tol_act);
    for (size_t i = 0; i < nw; i++) rdw[i] += sdw[i];
    down_f32(got, d_dw, nw);
    check_close("matmul_bwd dweight (+=, with SET_DINP)", got, rdw, nw, tol_act);
    ops->matmul_bwd(d_dx, d_dw, d_dout, d_x, d_w, N, C, OC, SHLM_MM_SET_DWEIGHT);
    for (size_t i = 0; i < nx; i++) sdx[i] *= 2;
    down_act(got, d_dx, nx);
    check_close("matmul_bwd dinp (+=, with SET_DWEIGHT)", got, sdx, nx, tol_act);
    down_f32(got, d_dw, nw);
    check_close("matmul_bwd dweight (=, SET_DWEIGHT)", got, sdw, nw, tol_act);

    double *gx = hd(nx), *gw = hd(nw);
    ref_matmul_bwd(gx, gw, c.dout, c.x, c.w, N, C, OC);
    check_fd("matmul dinp", mm_loss, &c, c.x, nx, gx);
    check_fd("matmul dweight", mm_loss, &c, c.w, nw, gw);
}

/* ---- rope ---- */
typedef struct rope_ctx {
    double *x, *dout, *out;
    int N, T, stride, n_heads, hd;
    double theta;
} rope_ctx;
static double rope_loss(void *p) {
    rope_ctx *c = p;
    ref_rope_fwd(c->out, c->x, c->N, c->T, c->stride, c->n_heads, c->hd, c->theta);
    return dot_d(c->out, c->dout, (size_t)c->N * c->stride);
}

static void rope_case(const char *tag, int N, int T, int stride, int n_heads, int hdim, float theta,
                      double tol, int with_fd) {
    const size_t n = (size_t)N * stride;
    char name[160];
    float *x = rnd_act(n, 1.0), *dout = rnd_act(n, 1.0), *got = hf(n);
    rope_ctx c = {dup_d(x, n), dup_d(dout, n), hd(n), N, T, stride, n_heads, hdim, theta};
    double *ref = hd(n);
    void *d_x = up_act(x, n);

    ops->rope(d_x, N, T, stride, n_heads, hdim, theta, 0);
    ref_rope_fwd(ref, c.x, N, T, stride, n_heads, hdim, theta);
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

    /* inverse of forward is the identity */
    ops->rope(d_x, N, T, stride, n_heads, hdim, theta, 1);
    down_act(got, d_x, n);
    snprintf(name, sizeof name, "rope inverse(forward(x)) == x %s", tag);
    check_close(name, got, c.x, n, 2 * tol); /* two rotations */

    /* inverse applied to dout is the backward pass Jᵀ·dout */
    d_x = up_act(dout, n);
    ops->rope(d_x, N, T, stride, n_heads, hdim, theta, 1);
    ref_rope_bwd(ref, c.dout, N, T, stride, n_heads, hdim, theta);
    down_act(got, d_x, n);
    snprintf(name, sizeof name, "rope inverse == backward %s", tag);
    check_close(name, got, ref, n, tol);
    if (with_fd) check_fd("rope dx", rope_loss, &c, c.x, n, ref);
}

static void test_rope(void) {
    /* on a fused qkv buffer: q and k heads rotate (n_heads = nh + nkv), v heads do not;
     * N = 7 sequences of T = 13, so positions wrap */
    const int nh = 6, nkv = 2, hdim = 10;
    rope_case("(qkv rows, N=91 T=13 hd=10)", 7 * 13, 13, (nh + 2 * nkv) * hdim, nh + nkv, hdim,
              10000.0f, tol_act, 1);
    /* positions up to 4095: an fp32 angle would be ~2e-4 off here, so ask for 1e-6 */
    rope_case("(T=4096 hd=64, tol 1e-6)", 4096, 4096, 64, 1, 64, 10000.0f,
              ops->act_dtype == SHLM_F32 ? 1e-6 : tol_act, 0);
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

/* doc: NULL, or B·T document starts (host), named by `layout` */
static void attention_case(attn_shape s, const int32_t *doc, const char *layout) {
    const size_t nqkv = (size_t)s.B * s.T * (s.nh + 2 * s.nkv) * s.hd;
    const size_t no = (size_t)s.B * s.T * s.nh * s.hd, nl = (size_t)s.B * s.nh * s.T;
    char tag[128], name[192];
    snprintf(tag, sizeof tag, "B=%d T=%d nh=%d nkv=%d hd=%d%s%s", s.B, s.T, s.nh, s.nkv, s.hd,
             doc ? ", " : "", doc ? layout : "");
    /* scale 1.5: peaked enough that the softmax is far from uniform */
    float *qkv = rnd_act(nqkv, 1.5), *dout = rnd_act(no, 1.0), *junk = rnd_act(nqkv, 1e3);
    float *got = hf(nqkv);
    attn_ctx c = {dup_d(qkv, nqkv), dup_d(dout, no), hd(no), doc, s};
    double *ref = hd(no), *lse = hd(nl), *dref = hd(nqkv);
    void *d_qkv = up_act(qkv, nqkv), *d_dout = up_act(dout, no);
    void *d_out = up_act(junk, no), *d_dqkv = up_act(junk, nqkv); /* both must be overwritten */
    float *d_lse = up_f32(junk, nl);
    const int32_t *d_doc = doc ? up_i32(doc, (size_t)s.B * s.T) : NULL;

    ops->attention_fwd(d_out, d_lse, d_qkv, d_doc, s.B, s.T, s.nh, s.nkv, s.hd);
    ref_attention_fwd(ref, lse, c.qkv, doc, s);
    down_act(got, d_out, no);
    snprintf(name, sizeof name, "attention_fwd out %s", tag);
    check_close(name, got, ref, no, tol_act);
    down_f32(got, d_lse, nl);
    snprintf(name, sizeof name, "attention_fwd lse %s", tag);
    check_close(name, got, lse, nl, tol_act);

    ops->attention_bwd(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_doc, s.B, s.T, s.nh, s.nkv, s.hd,
                       0.0f);
    ref_attention_bwd(dref, c.dout, c.qkv, doc, s);
    down_act(got, d_dqkv, nqkv);
    snprintf(name, sizeof name, "attention_bwd dqkv (=) %s", tag);
    check_close(name, got, dref, nqkv, tol_act);

    /* rope_theta > 0 (ops.h): the gradient w.r.t. the pre-RoPE q, k is the plain one
     * followed by rope(inverse): bit for bit on cpu (it makes that very call), within
     * tol_act where a backend fuses the rotation (cuda rounds to bf16 once, not twice) */
    {
        const float theta = 10000.0f;
        const int C3 = (s.nh + 2 * s.nkv) * s.hd;
        float *unf = hf(nqkv), *fused = hf(nqkv);
        ops->rope(d_dqkv, s.B * s.T, s.T, C3, s.nh + s.nkv, s.hd, theta, 1);
        down_act(unf, d_dqkv, nqkv);
        void *d_rot = up_act(junk, nqkv);
        ops->attention_bwd(d_rot, d_dout, d_qkv, d_out, d_lse, d_doc, s.B, s.T, s.nh, s.nkv,
                           s.hd, theta);
        down_act(fused, d_rot, nqkv);
        snprintf(name, sizeof name, "attention_bwd rope = bwd then rope %s", tag);
        if (is_cpu) check_same(name, fused, unf, nqkv);
        else check_close(name, fused, dup_d(unf, nqkv), nqkv, tol_act);
    }

    snprintf(name, sizeof name, "attention dqkv %s", tag);
    check_fd(name, attn_loss, &c, c.qkv, nqkv, dref);
}

/* doc_start all zeros (one document per sequence) gives NULL's results bit for bit */
static void attention_zeros_case(attn_shape s) {
    const size_t nqkv = (size_t)s.B * s.T * (s.nh + 2 * s.nkv) * s.hd;
    const size_t no = (size_t)s.B * s.T * s.nh * s.hd, nl = (size_t)s.B * s.nh * s.T;
    float *qkv = rnd_act(nqkv, 1.5), *dout = rnd_act(no, 1.0);
    int32_t *zeros = xcalloc((size_t)s.B * s.T, sizeof(int32_t));
    void *d_qkv = up_act(qkv, nqkv), *d_dout = up_act(dout, no);
    const int32_t *d_zeros = up_i32(zeros, (size_t)s.B * s.T);
    float *o[2], *l[2], *g[2];
    for (int k = 0; k < 2; k++) {
        const int32_t *doc = k ? d_zeros : NULL;
        void *d_out = dalloc(no * shlm_dtype_size(ops->act_dtype));
        void *d_dqkv = dalloc(nqkv * shlm_dtype_size(ops->act_dtype));
        float *d_lse = dalloc(nl * sizeof(float));
        ops->attention_fwd(d_out, d_lse, d_qkv, doc, s.B, s.T, s.nh, s.nkv, s.hd);
        ops->attention_bwd(d_dqkv, d_dout, d_qkv, d_out, d_lse, doc, s.B, s.T, s.nh, s.nkv, s.hd,
                           10000.0f);
        down_act(o[k] = hf(no), d_out, no);
        down_f32(l[k] = hf(nl), d_lse, nl);
        down_act(g[k] = hf(nqkv), d_dqkv, nqkv);
    }
    char tag[96], name[160];
    snprintf(tag, sizeof tag, "B=%d T=%d nh=%d nkv=%d hd=%d", s.B, s.T, s.nh, s.nkv, s.hd);
    snprintf(name, sizeof name, "attention doc_start zeros == NULL: out %s", tag);
    check_same(name, o[1], o[0], no);
    snprintf(name, sizeof name, "attention doc_start zeros == NULL: lse %s", tag);
    check_same(name, l[1], l[0], nl);
    snprintf(name, sizeof name, "attention doc_start zeros == NULL: dqkv (rope) %s", tag);
    check_same(name, g[1], g[0], nqkv);
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
}

static void test_attention(void) {
    attention_case((attn_shape){3, 13, 6, 2, 10}, NULL, NULL); /* GQA, 3 query heads per kv head */
    attention_case((attn_shape){3, 13, 6, 3, 10}, NULL, NULL); /* GQA, 2 per kv head */
    attention_case((attn_shape){2, 13, 6, 6, 10}, NULL, NULL); /* plain multi-head */
    attention_case((attn_shape){2, 7, 4, 1, 8}, NULL, NULL);   /* multi-query */
    attention_case((attn_shape){2, 1, 2, 1, 4}, NULL, NULL);   /* T = 1: each row sees only itself */

    /* document masks: a different layout per sequence of a batch, odd sizes */
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
    };
    for (size_t k = 0; k < sizeof docs / sizeof docs[0]; k++) {
        const attn_shape s = docs[k].s;
        int32_t *doc = xcalloc((size_t)s.B * s.T, sizeof(int32_t));
        char layout[96] = "";
        for (int b = 0; b < s.B; b++) {
            doc_layout(doc + (size_t)b * s.T, s.T, docs[k].kind[b], docs[k].maxlen, rnd_u64);
            snprintf(layout + strlen(layout), sizeof layout - strlen(layout), "%s%s", b ? "|" : "",
                     doc_layout_name(docs[k].kind[b]));
        }
        attention_case(s, doc, layout);
    }
    attention_zeros_case((attn_shape){3, 13, 6, 2, 10});
    attention_zeros_case((attn_shape){2, 37, 4, 1, 8});
    if (is_cpu) attention_bad_doc_case();
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

static void test_swiglu(void) {
    const int N = 7 * 13, F = 23;
    const size_t ng = (size_t)N * 2 * F, no = (size_t)N * F;
    float *gu = rnd_act(ng, 2.0), *dout = rnd_act(no, 1.0), *junk = rnd_act(ng, 1e3);
    gu[0] = 30.0f; /* saturated gate */
    gu[1] = -30.0f;
    gu[2] = -100.0f; /* exp(100) overflows fp32 in a naive sigmoid */
    float *got = hf(ng);
    swi_ctx c = {dup_d(gu, ng), dup_d(dout, no), hd(no), N, F};
    double *ref = hd(no), *dref = hd(ng);
    void *d_gu = up_act(gu, ng), *d_dout = up_act(dout, no);
    void *d_out = up_act(junk, no), *d_dgu = up_act(junk, ng);

    ops->swiglu_fwd(d_out, d_gu, N, F);
    ref_swiglu_fwd(ref, c.gu, N, F);
    down_act(got, d_out, no);
    check_close("swiglu_fwd out (=)", got, ref, no, tol_act);

    ops->swiglu_bwd(d_dgu, d_dout, d_gu, N, F);
    ref_swiglu_bwd(dref, c.dout, c.gu, N, F);
    down_act(got, d_dgu, ng);
    check_close("swiglu_bwd dgu (=)", got, dref, ng, tol_act);
    check_fd("swiglu dgu", swi_loss, &c, c.gu, ng, dref);

    if (is_cpu) { /* documented in cpu.h: dgu may alias gu */
        float *buf = dup_f(gu, ng);
        ops->swiglu_bwd(buf, dout, buf, N, F);
        check_close("swiglu_bwd cpu: dgu aliasing gu", buf, dref, ng, tol_act);
    }
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

static void test_xent(void) {
    const int N = 7 * 13, V = 67;
    const size_t n = (size_t)N * V;
    float *x = rnd_act(n, 3.0), *junk = rnd_act(n, 1e3), *got = hf(n);
    /* rows far from zero: without the max subtraction exp() overflows (fp32 at 88.7) */
    for (int j = 0; j < V; j++) {
        x[1 * V + j] += 1000.0f;
        x[2 * V + j] += 90.0f;
        x[4 * V + j] -= 1000.0f;
    }
    if (ops->act_dtype == SHLM_BF16)
        for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
    int32_t *tgt = xcalloc(N, sizeof(int32_t));
    int n_valid = 0;
    for (int i = 0; i < N; i++) {
        tgt[i] = i % 5 == 3 ? -1 : rnd_int(V); /* every fifth row ignored */
        n_valid += tgt[i] >= 0;
    }
    tgt[9] = -100; /* any negative target is ignored (-100 is PyTorch's default) */
    n_valid -= 1;
    tgt[0] = 0;
    tgt[5] = V - 1;
    const float dscale = 1.0f / (float)n_valid;
    xent_ctx c = {dup_d(x, n), hd(N), tgt, N, V, dscale};
    double *loss = hd(N), *dref = hd(n);
    ref_xent(loss, dref, c.x, tgt, N, V, dscale);

    void *d_x = up_act(x, n), *d_dx = up_act(junk, n), *d_t = up_i32(tgt, N);
    float *d_l = up_f32(junk, N);
    ops->xent_fwd_bwd(d_l, d_dx, d_x, d_t, N, V, dscale);
    down_f32(got, d_l, N);
    check_close("xent losses (ignored rows 0, shifted rows)", got, loss, N, tol_act);
    down_act(got, d_dx, n);
    check_close("xent dlogits (=, ignored rows 0)", got, dref, n, tol_act);

    ops->to_device(d_l, junk, N * sizeof(float));
    ops->xent_fwd_bwd(d_l, NULL, d_x, d_t, N, V, dscale);
    down_f32(got, d_l, N);
    check_close("xent losses with dlogits NULL", got, loss, N, tol_act);
    down_act(got, d_x, n);
    check_same("xent dlogits NULL leaves logits alone", got, x, n);

    ops->to_device(d_l, junk, N * sizeof(float));
    ops->xent_fwd_bwd(d_l, d_x, d_x, d_t, N, V, dscale); /* in place */
    down_f32(got, d_l, N);
    check_close("xent losses with dlogits == logits", got, loss, N, tol_act);
    down_act(got, d_x, n);
    check_close("xent dlogits == logits (in place)", got, dref, n, tol_act);

    check_fd("xent dlogits", xent_loss, &c, c.x, n, dref);
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
        ops->adamw(d_p, d_g, d_m, d_v, n, lr, b1, b2, eps, wd, gscale, steps[k]);
        char name[128];
        down_f32(got, d_p, n);
        snprintf(name, sizeof name, "adamw param (step %d, grad_scale, wd)", steps[k]);
        check_close(name, got, rp, n, TOL_F32);
        /* the update itself, so that a wrong step cannot hide behind |param| */
        float *delta = hf(n);
        double *rdelta = hd(n);
        for (size_t i = 0; i < n; i++) {
            delta[i] = (float)((double)got[i] - p[i]);
            rdelta[i] = rp[i] - p[i];
        }
        snprintf(name, sizeof name, "adamw update param_new - param (step %d)", steps[k]);
        check_close(name, delta, rdelta, n, TOL_F32);
        down_f32(got, d_m, n);
        snprintf(name, sizeof name, "adamw m (step %d)", steps[k]);
        check_close(name, got, rm, n, TOL_F32);
        down_f32(got, d_v, n);
        snprintf(name, sizeof name, "adamw v (step %d)", steps[k]);
        check_close(name, got, rv, n, TOL_F32);
    }
}

static void test_reductions(void) {
    const size_t sizes[] = {5, 4097, 1000003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *x = rnd_f(n, 1.0);
        long double want = 0.0L;
        for (size_t i = 0; i < n; i++) want += (long double)x[i] * x[i];
        float *d = up_f32(x, n);
        double got = ops->sum_squares(d, n);
        char name[96];
        snprintf(name, sizeof name, "sum_squares n=%zu (double accumulation, tol 1e-12)", n);
        report(name, fabs(got - (double)want) / (double)want, 1e-12);
    }
    check_true("sum_squares n=0 is 0", ops->sum_squares(NULL, 0) == 0.0);

    const size_t n = 1001;
    float *x = rnd_f(n, 1.0), *got = hf(n);
    double *want = hd(n);
    float *d = up_f32(x, n);
    float *y = rnd_f(n, 1.0);
    for (size_t i = 0; i < n; i++) want[i] = (double)y[i] + (double)x[i];
    float *dy = up_f32(y, n);
    ops->accumulate(dy, d, n);
    down_f32(got, dy, n);
    check_close("accumulate y += x", got, want, n, TOL_F32);
}

/* ---- cpu: same inputs give bit-identical results, whatever the thread count ---- */
enum { DET_N_OUT = 9 };
static const char *const det_names[DET_N_OUT] = {
    "embedding_bwd", "rmsnorm_fwd", "rmsnorm_bwd dinp+dweight", "rope", "attention_fwd out+lse",
    "attention_bwd", "swiglu_bwd",  "xent",                     "adamw"};

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
        (size_t)N * 2 * F, (size_t)N * V + N, 3 * (size_t)N * C};
    for (int k = 0; k < DET_N_OUT; k++) {
        det_len[k] = len[k];
        out[k] = hf(len[k]);
    }
    ops->embedding_bwd(out[0], dy, tok, N, C);
    ops->rmsnorm_fwd(out[1], out[1] + (size_t)N * C, x, w, N, C, 1e-5f);
    ops->rmsnorm_bwd(out[2], out[2] + (size_t)N * C, dy, x, w, out[1] + (size_t)N * C, N, C);
    memcpy(out[3], qkv, nq * sizeof(float));
    ops->rope(out[3], N, T, (nh + 2 * nkv) * hdim, nh + nkv, hdim, 10000.0f, 0);
    ops->attention_fwd(out[4], out[4] + no, qkv, NULL, B, T, nh, nkv, hdim);
    ops->attention_bwd(out[5], dout, qkv, out[4], out[4] + no, NULL, B, T, nh, nkv, hdim, 0.0f);
    ops->swiglu_bwd(out[6], dy, gu, N, F); /* dout (N,F) fits inside dy (N,C) */
    ops->xent_fwd_bwd(out[7] + (size_t)N * V, out[7], logits, tgt, N, V, 0.01f);
    float *p = out[8], *m = p + (size_t)N * C, *v = m + (size_t)N * C;
    memcpy(p, x, (size_t)N * C * sizeof(float));
    ops->adamw(p, g, m, v, (size_t)N * C, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 1);
}

static void test_determinism(void) {
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
    /* matmul goes through OpenBLAS, whose blocking may follow the thread count: only
     * same-count repeatability is promised */
    const int M = 91, K = 37, OC = 29;
    float *xx = rnd_f((size_t)M * K, 1.0), *ww = rnd_f((size_t)OC * K, 1.0);
    float *y1 = hf((size_t)M * OC), *y2 = hf((size_t)M * OC);
    ops->matmul_fwd(y1, xx, ww, M, K, OC, NULL);
    ops->matmul_fwd(y2, xx, ww, M, K, OC, NULL);
    check_same("cpu: matmul_fwd repeatable with 3 threads", y2, y1, (size_t)M * OC);
    shlm_cpu_set_threads(1);
}

int main(int argc, char **argv) {
    const char *backend = argc > 1 ? argv[1] : "cpu";
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 20240601u;
    /* the thread counts are part of the reproduction: name them when they were set */
    const char *omp = getenv("OMP_NUM_THREADS"), *blas = getenv("OPENBLAS_NUM_THREADS");
    printf("# reproduce:%s%s%s%s %s %s %" PRIu64 "\n", omp ? " OMP_NUM_THREADS=" : "",
           omp ? omp : "", blas ? " OPENBLAS_NUM_THREADS=" : "", blas ? blas : "", argv[0], backend,
           seed);
    ops = shlm_ops_find(backend);
    if (ops == NULL) {
        fprintf(stderr, "test_kernels: backend '%s' is not built in\n", backend);
        return 1;
    }
    if (!ops->available()) {
        printf("# backend %s is not available on this machine: skipped\n", backend);
        return 77;
    }
    is_cpu = ops == &shlm_ops_cpu;
    tol_act = ops->act_dtype == SHLM_F32 ? TOL_F32 : TOL_BF16;
    printf("# backend %s, act dtype %s, criterion max|a-b|/max|b| < tol per tensor\n", ops->name,
           shlm_dtype_name(ops->act_dtype));
    rng_state = seed;

    void (*const tests[])(void) = {test_backends, test_memory, test_convert, test_embedding,
                                   test_rmsnorm,  test_matmul, test_rope,    test_attention,
                                   test_swiglu,   test_xent,   test_adamw,   test_reductions};
    for (size_t k = 0; k < sizeof tests / sizeof tests[0]; k++) {
        tests[k]();
        release_all();
    }
    if (is_cpu) {
        test_determinism();
        release_all();
    }

    printf("# %d checks, %d failed: %s\n", n_checks, n_failed, n_failed ? "FAIL" : "PASS");
    return n_failed ? 1 : 0;
}
