/* GPU test of the cuda backend: every op of shlm_ops_cuda against shlm_ops_cpu on the same
 * random inputs (rounded to bf16 first, so both backends see identical values). */

/* Usage: test_ops_cuda [seed [group]]   (run by `make check-gpu`; exits 77 when no GPU is visible)
 * group runs one group of checks only: memory, embedding, rmsnorm, matmul, rope,
 * attention, attention-small (its cases with T <= 300, quick enough for
 * compute-sanitizer), swiglu, xent, adamw.
 *
 * Criterion, per output tensor: relative L2 error ‖gpu − cpu‖ / ‖cpu‖ < tol, with tol
 * per op printed on every line: 1e-2 for bf16 outputs (bf16 keeps 8 significant bits, so
 * rounding the output alone gives ~3e-3), 2e-2 for attention's backward (P and dS are
 * rounded to bf16 before their products, as in every flash attention), 1e-4 for fp32
 * outputs computed from bf16 operands in a different summation order (weight gradients,
 * rstd, lse, losses), and 0 (bit-identical) where both backends do the same fp32
 * operations in the same order (conversions, copies, embedding backward, AdamW). A NaN,
 * or an output element the GPU left unwritten (outputs are poisoned with NaN before
 * each "=" op), fails. Shapes: odd sizes that take the scalar (unaligned) paths, and
 * Llama-like ones (d = 4096, hd = 128, T up to 1024, GQA). attention_bwd also runs with
 * rope_theta > 0 (the inverse RoPE fused into the backward) against cpu attention_bwd
 * then cpu rope(inverse) at 2e-2, and against the gpu's own backward then its rope
 * kernel at 1e-2 (not bitwise: the fused path rounds to bf16 once, that one twice).
 * Attention also runs with document masks (doc_start, tests/doc_layout.h: several
 * documents per tile, documents spanning tiles, single tokens, a document at T - 1)
 * against the cpu backend's, and with an all-zero doc_start, which must give the bits of
 * doc_start NULL (forward, backward, backward with rope). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"
#include "tests/doc_layout.h"

extern const shlm_ops shlm_ops_cuda;

static const shlm_ops *gpu = &shlm_ops_cuda, *cpu = &shlm_ops_cpu;
static int n_checks, n_failed;
static const char *g_only; /* run only this group (NULL: all) */

static int want(const char *group) { return g_only == NULL || strcmp(g_only, group) == 0; }

/* ------------------------------------------------------------------ random numbers */
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

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_ops_cuda: out of host memory\n");
        exit(1);
    }
    return p;
}
static float bf(float x) { return shlm_bf16_to_f32(shlm_f32_to_bf16(x)); }

/* n values ~ N(0, scale²), rounded to bf16 (what both backends then see) */
static float *rnd_bf(size_t n, double scale) {
    float *a = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = bf((float)(scale * rnd_normal()));
    return a;
}
/* plain fp32 values (fp32 tensors: weight gradients, optimizer state) */
static float *rnd_f(size_t n, double scale) {
    float *a = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = (float)(scale * rnd_normal());
    return a;
}
static float *dup(const float *a, size_t n) {
    float *d = xmalloc(n * sizeof(float));
    memcpy(d, a, n * sizeof(float));
    return d;
}

/* ------------------------------------------------------------------ device buffers */
/* bf16 act tensor on the GPU holding h (already bf16 values) */
static void *g_act(const float *h, size_t n) {
    uint16_t *b = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) b[i] = shlm_f32_to_bf16(h[i]);
    void *d = gpu->alloc(n * 2);
    gpu->to_device(d, b, n * 2);
    free(b);
    return d;
}
static void *g_bytes(const void *h, size_t bytes) {
    void *d = gpu->alloc(bytes);
    gpu->to_device(d, h, bytes);
    return d;
}
static float *g_f32(const float *h, size_t n) { return g_bytes(h, n * sizeof(float)); }
static float *h_act(const void *d, size_t n) {
    uint16_t *b = xmalloc(n * 2);
    gpu->to_host(b, d, n * 2);
    float *h = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = shlm_bf16_to_f32(b[i]);
    free(b);
    return h;
}
static float *h_f32(const void *d, size_t n) {
    float *h = xmalloc(n * sizeof(float));
    gpu->to_host(h, d, n * sizeof(float));
    return h;
}
/* all bits set: NaN in bf16 and in fp32, so an element the GPU does not write fails */
static void poison(void *d, size_t bytes) {
    void *h = xmalloc(bytes);
    memset(h, 0xFF, bytes);
    gpu->to_device(d, h, bytes);
    free(h);
}

/* ------------------------------------------------------------------ checks */
static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        if (isnan(a[i]) || isnan(ref[i])) return NAN;
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

static void report(const char *op, const char *shape, const char *what, double err, double tol) {
    int ok = tol > 0 ? err < tol : err == 0.0; /* NaN fails both */
    n_checks++;
    if (!ok) n_failed++;
    printf("  %-14s %-34s %-8s %10.3e %8.0e  %s\n", op, shape, what, err, tol,
           ok ? "ok" : "FAIL");
    fflush(stdout);
}

static void check(const char *op, const char *shape, const char *what, const float *gpu_out,
                  const float *cpu_out, size_t n, double tol) {
    report(op, shape, what, rel_l2(gpu_out, cpu_out, n), tol);
}

/* bit-identical fp32 arrays (NaNs compared by bits) */
static void check_bits(const char *op, const char *shape, const char *what, const void *a,
                       const void *b, size_t bytes) {
    double err = memcmp(a, b, bytes) == 0 ? 0.0 : 1.0;
    report(op, shape, what, err, 0.0);
}

#define TOL_BF16 1e-2
#define TOL_ATT_BWD 2e-2
#define TOL_F32 1e-4

/* ------------------------------------------------------------------ memory, conversion */
static void test_memory_convert(void) {
    /* alloc is zero-filled; copy and zero */
    {
        const size_t n = 1003;
        float *z = h_f32(gpu->alloc(n * sizeof(float)), n);
        float *zero = calloc(n, sizeof(float));
        check_bits("alloc", "1003 floats", "zeros", z, zero, n * sizeof(float));
        float *a = rnd_f(n, 1.0);
        float *da = g_f32(a, n), *db = gpu->alloc(n * sizeof(float));
        gpu->copy(db, da, n * sizeof(float));
        gpu->zero(db + 10, 100 * sizeof(float));
        float *hb = h_f32(db, n);
        memset(a + 10, 0, 100 * sizeof(float));
        check_bits("copy+zero", "1003 floats", "data", hb, a, n * sizeof(float));
        gpu->free(da);
        gpu->free(db);
        gpu->free(NULL);
        free(z), free(zero), free(a), free(hb);
    }
    /* f32 -> bf16 -> f32 and in-place rounding, with every special case of the rounding;
     * the offset of one element makes the second pass take the unaligned path */
    const size_t n = 10007;
    float *x = xmalloc((n + 1) * sizeof(float));
    const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f /* tie: to even */,
                              1.01171875f /* tie: up */, 3.4028235e38f /* rounds to inf */,
                              -3.4028235e38f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, 1.4e-45f,
                              3.14159265f, 65504.0f, 1e30f, -2.5e-20f};
    const size_t ns = sizeof specials / sizeof specials[0];
    for (size_t i = 0; i <= n; i++) {
        if (i < ns) {
            x[i] = specials[i];
        } else { /* random bits: every exponent, NaN payloads included */
            uint32_t u = (uint32_t)rnd_u64();
            memcpy(&x[i], &u, 4);
        }
    }
    for (int off = 0; off < 2; off++) {
        char shape[64];
        snprintf(shape, sizeof shape, "n=%zu%s", n, off ? " unaligned" : "");
        float *dx = g_f32(x, n + 1);
        uint16_t *dact = gpu->alloc((n + 1) * 2);
        gpu->f32_to_act(dact + off, dx + off, n);
        uint16_t *hb = xmalloc(n * 2), *rb = xmalloc(n * 2);
        gpu->to_host(hb, dact + off, n * 2);
        for (size_t i = 0; i < n; i++) rb[i] = shlm_f32_to_bf16(x[off + i]);
        check_bits("f32_to_act", shape, "bits", hb, rb, n * 2);
        float *back = gpu->alloc((n + 1) * sizeof(float));
        float *rf = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) rf[i] = shlm_bf16_to_f32(rb[i]);
        /* the collectives' casts: the same conversions under their own names */
        uint16_t *dact2 = gpu->alloc((n + 1) * 2);
        gpu->f32_to_bf16(dact2 + off, dx + off, n);
        gpu->to_host(hb, dact2 + off, n * 2);
        check_bits("f32_to_bf16", shape, "bits", hb, rb, n * 2);
        gpu->bf16_to_f32(back + off, dact2 + off, n);
        float *hf2 = h_f32(back + off, n);
        check_bits("bf16_to_f32", shape, "bits", hf2, rf, n * sizeof(float));
        gpu->free(dact2);
        free(hf2);
        gpu->round_to_bf16(dx + off, n);
        float *hr = h_f32(dx + off, n), *rr = dup(x + off, n);
        shlm_cpu_round_to_bf16(rr, n);
        check_bits("round_to_bf16", shape, "bits", hr, rr, n * sizeof(float));
        gpu->free(dx), gpu->free(dact), gpu->free(back);
        free(hb), free(rb), free(rf), free(hr), free(rr);
    }
    free(x);
    /* a size where every thread of the cast's grid-stride loop takes more than one pair of
     * loads (its grid holds at most 32 blocks of 256 threads per SM, 4 elements each) */
    {
        const size_t nb = (size_t)40000003;
        float *xb = xmalloc(nb * sizeof(float));
        for (size_t i = 0; i < nb; i++) {
            uint32_t u = (uint32_t)rnd_u64();
            memcpy(&xb[i], &u, 4);
        }
        float *dx = g_f32(xb, nb);
        uint16_t *dact = gpu->alloc(nb * 2);
        gpu->f32_to_act(dact, dx, nb);
        uint16_t *hb = xmalloc(nb * 2), *rb = xmalloc(nb * 2);
        gpu->to_host(hb, dact, nb * 2);
        for (size_t i = 0; i < nb; i++) rb[i] = shlm_f32_to_bf16(xb[i]);
        check_bits("f32_to_act", "n=40000003", "bits", hb, rb, nb * 2);
        gpu->free(dx), gpu->free(dact);
        free(xb), free(hb), free(rb);
    }
}

/* ------------------------------------------------------------------ embedding */
static void test_embedding(int N, int C, int V) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d V=%d", N, C, V);
    int32_t *tok = xmalloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rnd_u64() % (uint64_t)V);
    float *wte = rnd_bf((size_t)V * C, 1.0), *dout = rnd_bf((size_t)N * C, 1.0);
    float *dwte = rnd_f((size_t)V * C, 1.0);
    int32_t *dtok = g_bytes(tok, (size_t)N * sizeof(int32_t));
    void *dwte_a = g_act(wte, (size_t)V * C), *dout_a = g_act(dout, (size_t)N * C);
    void *dout_g = gpu->alloc((size_t)N * C * 2);
    poison(dout_g, (size_t)N * C * 2);
    gpu->embedding_fwd(dout_g, dtok, dwte_a, N, C);
    float *c_out = xmalloc((size_t)N * C * sizeof(float));
    cpu->embedding_fwd(c_out, tok, wte, N, C);
    float *g_out = h_act(dout_g, (size_t)N * C);
    check("embedding_fwd", shape, "out", g_out, c_out, (size_t)N * C, 0.0);

    float *d_dwte = g_f32(dwte, (size_t)V * C);
    gpu->embedding_bwd(d_dwte, dout_a, dtok, N, C);
    cpu->embedding_bwd(dwte, dout, tok, N, C);
    float *g_dwte = h_f32(d_dwte, (size_t)V * C);
    /* the same fp32 additions in the same (token) order: bit-identical */
    check_bits("embedding_bwd", shape, "dwte", g_dwte, dwte, (size_t)V * C * sizeof(float));
    gpu->free(dtok), gpu->free(dwte_a), gpu->free(dout_a), gpu->free(dout_g), gpu->free(d_dwte);
    free(tok), free(wte), free(dout), free(dwte), free(c_out), free(g_out), free(g_dwte);
}

/* ------------------------------------------------------------------ rmsnorm */
static void test_rmsnorm(int N, int C) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
    const size_t nc = (size_t)N * C;
    float *x = rnd_bf(nc, 1.0), *w = xmalloc((size_t)C * sizeof(float));
    for (int c = 0; c < C; c++) w[c] = bf((float)(1.0 + 0.2 * rnd_normal()));
    const float eps = 1e-5f;
    float *c_out = xmalloc(nc * sizeof(float)), *c_rstd = xmalloc((size_t)N * sizeof(float));
    cpu->rmsnorm_fwd(c_out, c_rstd, x, w, N, C, eps);
    void *gx = g_act(x, nc), *gw = g_act(w, C), *gout = gpu->alloc(nc * 2);
    float *grstd = gpu->alloc((size_t)N * sizeof(float));
    poison(gout, nc * 2);
    poison(grstd, (size_t)N * sizeof(float));
    gpu->rmsnorm_fwd(gout, grstd, gx, gw, N, C, eps);
    float *h_out = h_act(gout, nc), *h_rstd = h_f32(grstd, N);
    check("rmsnorm_fwd", shape, "out", h_out, c_out, nc, TOL_BF16);
    check("rmsnorm_fwd", shape, "rstd", h_rstd, c_rstd, N, TOL_F32);

    /* backward with both outputs preloaded (+=), rstd from the cpu for both */
    float *dy = rnd_bf(nc, 1.0), *dx = rnd_bf(nc, 1.0), *dw = rnd_f(C, 1.0);
    void *gdy = g_act(dy, nc), *gdx = g_act(dx, nc);
    float *gdw = g_f32(dw, C), *grs = g_f32(c_rstd, N);
    gpu->rmsnorm_bwd(gdx, gdw, gdy, gx, gw, grs, N, C);
    cpu->rmsnorm_bwd(dx, dw, dy, x, w, c_rstd, N, C);
    float *h_dx = h_act(gdx, nc), *h_dw = h_f32(gdw, C);
    check("rmsnorm_bwd", shape, "dinp", h_dx, dx, nc, TOL_BF16);
    check("rmsnorm_bwd", shape, "dweight", h_dw, dw, C, TOL_F32);
    gpu->free(gx), gpu->free(gw), gpu->free(gout), gpu->free(grstd), gpu->free(gdy);
    gpu->free(gdx), gpu->free(gdw), gpu->free(grs);
    free(x), free(w), free(c_out), free(c_rstd), free(h_out), free(h_rstd), free(dy), free(dx);
    free(dw), free(h_dx), free(h_dw);
}

/* ------------------------------------------------------------------ matmul */
/* off: element offset of every GPU operand (1 makes them 2-byte aligned only, the case of
 * a tensor that starts mid-unit) */
static void test_matmul(int N, int C, int OC, int off) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d OC=%d%s", N, C, OC, off ? " unaligned" : "");
    const size_t nin = (size_t)N * C, nw = (size_t)OC * C, nout = (size_t)N * OC;
    float *x = rnd_bf(nin, 1.0), *w = rnd_bf(nw, 0.05), *pre = rnd_bf(nout, 1.0);
    uint16_t *gx = g_act(x, nin), *gw = g_act(w, nw);
    /* re-place the operands at the offset */
    uint16_t *gx_o = gpu->alloc((nin + off) * 2), *gw_o = gpu->alloc((nw + off) * 2);
    gpu->copy(gx_o + off, gx, nin * 2);
    gpu->copy(gw_o + off, gw, nw * 2);
    uint16_t *gout = gpu->alloc((nout + off) * 2);

    /* residual: 0 none, 1 aliasing out (out += ...), 2 a separate buffer */
    uint16_t *gres = gpu->alloc((nout + off) * 2);
    {
        void *t = g_act(pre, nout);
        gpu->copy(gres + off, t, nout * 2);
        gpu->free(t);
    }
    for (int acc = 0; acc < 3; acc++) {
        char what[24];
        snprintf(what, sizeof what, "out residual=%d", acc);
        float *c_out = acc ? dup(pre, nout) : xmalloc(nout * sizeof(float));
        cpu->matmul_fwd(c_out, x, w, N, C, OC, acc ? c_out : NULL);
        if (acc == 1) {
            void *t = g_act(pre, nout);
            gpu->copy(gout + off, t, nout * 2);
            gpu->free(t);
        } else {
            poison(gout + off, nout * 2);
        }
        gpu->matmul_fwd(gout + off, gx_o + off, gw_o + off, N, C, OC,
                        acc == 0 ? NULL : acc == 1 ? (void *)(gout + off) : (void *)(gres + off));
        float *h = h_act(gout + off, nout);
        check("matmul_fwd", shape, what, h, c_out, nout, TOL_BF16);
        free(c_out), free(h);
    }
    gpu->free(gres);

    /* backward, both outputs preloaded (+=); then each alone (the other NULL) */
    float *dy = rnd_bf(nout, 1.0), *dx = rnd_bf(nin, 1.0), *dw = rnd_f(nw, 1.0);
    uint16_t *gdy = gpu->alloc((nout + off) * 2), *gdx = gpu->alloc((nin + off) * 2);
    float *gdw = gpu->alloc((nw + off) * sizeof(float));
    {
        void *t = g_act(dy, nout);
        gpu->copy(gdy + off, t, nout * 2);
        gpu->free(t);
        t = g_act(dx, nin);
        gpu->copy(gdx + off, t, nin * 2);
        gpu->free(t);
        gpu->to_device(gdw + off, dw, nw * sizeof(float));
    }
    /* 0 both, 1 dinp only, 2 dweight only (+=); 3 both with "=" over the preloaded values */
    for (int which = 0; which < 4; which++) {
        const int flags = which == 3 ? SHLM_MM_SET_DINP | SHLM_MM_SET_DWEIGHT : 0;
        float *c_dx = dup(dx, nin), *c_dw = dup(dw, nw);
        cpu->matmul_bwd(which == 2 ? NULL : c_dx, which == 1 ? NULL : c_dw, dy, x, w, N, C, OC,
                        flags);
        gpu->matmul_bwd(which == 2 ? NULL : gdx + off, which == 1 ? NULL : gdw + off, gdy + off,
                        gx_o + off, gw_o + off, N, C, OC, flags);
        float *h_dx = h_act(gdx + off, nin), *h_dw = h_f32(gdw + off, nw);
        const char *wx[] = {"dinp", "dinp", "dinp-", "dinp="},
                   *ww[] = {"dweight", "dweight-", "dweight", "dweight="};
        check("matmul_bwd", shape, wx[which], h_dx, c_dx, nin, TOL_BF16);
        check("matmul_bwd", shape, ww[which], h_dw, c_dw, nw, TOL_F32);
        /* reset both sides to the same state for the next variant */
        void *t = g_act(dx, nin);
        gpu->copy(gdx + off, t, nin * 2);
        gpu->free(t);
        gpu->to_device(gdw + off, dw, nw * sizeof(float));
        free(c_dx), free(c_dw), free(h_dx), free(h_dw);
    }
    gpu->free(gx), gpu->free(gw), gpu->free(gx_o), gpu->free(gw_o), gpu->free(gout);
    gpu->free(gdy), gpu->free(gdx), gpu->free(gdw);
    free(x), free(w), free(pre), free(dy), free(dx), free(dw);
}

/* ------------------------------------------------------------------ rope */
static void test_rope(int B, int T, int nh, int nkv, int hd, float theta) {
    const int N = B * T, stride = (nh + 2 * nkv) * hd, heads = nh + nkv;
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d T=%d heads=%d hd=%d", N, T, heads, hd);
    const size_t n = (size_t)N * stride;
    float *x = rnd_bf(n, 1.0);
    void *gx = g_act(x, n);
    for (int inv = 0; inv < 2; inv++) {
        float *c = dup(x, n);
        cpu->rope(c, N, T, stride, heads, hd, theta, inv);
        void *g = gpu->alloc(n * 2);
        gpu->copy(g, gx, n * 2);
        gpu->rope(g, N, T, stride, heads, hd, theta, inv);
        float *h = h_act(g, n);
        /* the whole rows: the v heads after the rotated ones must come back untouched */
        check("rope", shape, inv ? "inverse" : "forward", h, c, n, TOL_BF16);
        gpu->free(g);
        free(c), free(h);
    }
    gpu->free(gx);
    free(x);
}

/* ------------------------------------------------------------------ attention */
/* the q, k and v parts of dqkv (N rows) on their own: a wrong one cannot hide behind a
 * large other; names[p] labels part p */
static void check_qkv_parts(const char *shape, const char *const names[3], const float *got,
                            const float *ref, int N, int nh, int nkv, int hd, double tol) {
    const int C3 = (nh + 2 * nkv) * hd;
    const int part_off[3] = {0, nh * hd, (nh + nkv) * hd}, part_w[3] = {nh * hd, nkv * hd, nkv * hd};
    for (int p = 0; p < 3; p++) {
        size_t m = (size_t)N * part_w[p];
        float *a = xmalloc(m * sizeof(float)), *r = xmalloc(m * sizeof(float));
        for (int i = 0; i < N; i++) {
            memcpy(a + (size_t)i * part_w[p], got + (size_t)i * C3 + part_off[p],
                   (size_t)part_w[p] * sizeof(float));
            memcpy(r + (size_t)i * part_w[p], ref + (size_t)i * C3 + part_off[p],
                   (size_t)part_w[p] * sizeof(float));
        }
        check("attention_bwd", shape, names[p], a, r, m, tol);
        free(a), free(r);
    }
}

/* doc_kind < 0: the plain causal mask (doc_start NULL), also checked bitwise against an
 * all-zero doc_start; else every sequence cut into documents by doc_layout(doc_kind,
 * maxlen) (tests/doc_layout.h), the cpu backend masking the same way */
static void test_attention(int B, int T, int nh, int nkv, int hd, int doc_kind, int maxlen) {
    char shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d nh=%d nkv=%d hd=%d%s%s", B, T, nh, nkv, hd,
             doc_kind < 0 ? "" : " ", doc_kind < 0 ? "" : doc_layout_name(doc_kind));
    const int N = B * T, C3 = (nh + 2 * nkv) * hd, CO = nh * hd;
    const size_t nqkv = (size_t)N * C3, nout = (size_t)N * CO, nlse = (size_t)B * nh * T;
    int32_t *doc = NULL, *gdoc = NULL;
    if (doc_kind >= 0) {
        doc = xmalloc((size_t)N * sizeof(int32_t));
        for (int b = 0; b < B; b++)
            doc_layout(doc + (size_t)b * T, T, (enum doc_layout_kind)doc_kind, maxlen, rnd_u64);
        gdoc = g_bytes(doc, (size_t)N * sizeof(int32_t));
    }
    float *qkv = rnd_bf(nqkv, 1.0);
    float *c_out = xmalloc(nout * sizeof(float)), *c_lse = xmalloc(nlse * sizeof(float));
    cpu->attention_fwd(c_out, c_lse, qkv, doc, B, T, nh, nkv, hd);
    void *gqkv = g_act(qkv, nqkv), *gout = gpu->alloc(nout * 2);
    float *glse = gpu->alloc(nlse * sizeof(float));
    poison(gout, nout * 2);
    poison(glse, nlse * sizeof(float));
    gpu->attention_fwd(gout, glse, gqkv, gdoc, B, T, nh, nkv, hd);
    float *h_out = h_act(gout, nout), *h_lse = h_f32(glse, nlse);
    check("attention_fwd", shape, "out", h_out, c_out, nout, TOL_BF16);
    check("attention_fwd", shape, "lse", h_lse, c_lse, nlse, TOL_F32);

    /* backward from the same out (the cpu's, rounded to bf16) and lse on both sides */
    for (size_t i = 0; i < nout; i++) c_out[i] = bf(c_out[i]);
    float *dout = rnd_bf(nout, 1.0);
    float *c_dqkv = xmalloc(nqkv * sizeof(float));
    cpu->attention_bwd(c_dqkv, dout, qkv, c_out, c_lse, doc, B, T, nh, nkv, hd, 0.0f);
    void *gdout = g_act(dout, nout), *go = g_act(c_out, nout), *gdqkv = gpu->alloc(nqkv * 2);
    float *gl = g_f32(c_lse, nlse);
    poison(gdqkv, nqkv * 2);
    gpu->attention_bwd(gdqkv, gdout, gqkv, go, gl, gdoc, B, T, nh, nkv, hd, 0.0f);
    float *h_dqkv = h_act(gdqkv, nqkv);
    check("attention_bwd", shape, "dqkv", h_dqkv, c_dqkv, nqkv, TOL_ATT_BWD);
    /* deterministic: a second run into poisoned memory gives the same bits */
    poison(gdqkv, nqkv * 2);
    gpu->attention_bwd(gdqkv, gdout, gqkv, go, gl, gdoc, B, T, nh, nkv, hd, 0.0f);
    float *h_dqkv2 = h_act(gdqkv, nqkv);
    check("attention_bwd", shape, "rerun", h_dqkv2, h_dqkv, nqkv, 0);
    free(h_dqkv2);
    const char *const part_name[3] = {"dq", "dk", "dv"};
    check_qkv_parts(shape, part_name, h_dqkv, c_dqkv, N, nh, nkv, hd, TOL_ATT_BWD);

    /* rope_theta > 0: dq, dk w.r.t. the pre-RoPE q, k. The cpu reference is the result
     * above then cpu rope(inverse), which is exactly what cpu attention_bwd(theta) runs.
     * The gpu rotates the fp32 accumulators of its wgmma kernels (hd 64 and 128 on an
     * H200) and runs its rope kernel after the mma.sync ones (other shapes, or
     * cuda.attention = mma_sync), so against its own attention_bwd then rope (two roundings to
     * bf16 instead of one) it is close, not bitwise equal: TOL_BF16 there. */
    const float theta = 10000.0f;
    float *c_rot = dup(c_dqkv, nqkv);
    cpu->rope(c_rot, N, T, C3, nh + nkv, hd, theta, 1);
    poison(gdqkv, nqkv * 2);
    gpu->attention_bwd(gdqkv, gdout, gqkv, go, gl, gdoc, B, T, nh, nkv, hd, theta);
    float *h_rot = h_act(gdqkv, nqkv);
    check("attention_bwd", shape, "dqkv+rope", h_rot, c_rot, nqkv, TOL_ATT_BWD);
    const char *const rope_name[3] = {"dq+rope", "dk+rope", "dv+rope"};
    check_qkv_parts(shape, rope_name, h_rot, c_rot, N, nh, nkv, hd, TOL_ATT_BWD);
    poison(gdqkv, nqkv * 2);
    gpu->attention_bwd(gdqkv, gdout, gqkv, go, gl, gdoc, B, T, nh, nkv, hd, theta);
    float *h_rot2 = h_act(gdqkv, nqkv);
    check("attention_bwd", shape, "rope-rerun", h_rot2, h_rot, nqkv, 0);
    /* the unfused gpu path: the plain backward (h_dqkv), then the gpu's rope inverse */
    void *g_unf = g_act(h_dqkv, nqkv);
    gpu->rope(g_unf, N, T, C3, nh + nkv, hd, theta, 1);
    float *h_unf = h_act(g_unf, nqkv);
    check("attention_bwd", shape, "unfused", h_rot, h_unf, nqkv, TOL_BF16);
    /* dv is not rotated: the same bits with and without rope */
    {
        const size_t w = (size_t)nkv * hd, off = (size_t)(nh + nkv) * hd;
        int same = 1;
        for (int i = 0; i < N && same; i++)
            same = memcmp(h_rot + (size_t)i * C3 + off, h_dqkv + (size_t)i * C3 + off,
                          w * sizeof(float)) == 0;
        report("attention_bwd", shape, "dv=norope", same ? 0.0 : 1.0, 0.0);
    }
    gpu->free(g_unf);
    if (doc_kind < 0) {
        /* an all-zero doc_start (one document per sequence) runs the document kernels and
         * must give the plain ones' bits: forward, backward, backward with rope */
        int32_t *zeros = calloc((size_t)N, sizeof(int32_t));
        void *gz = g_bytes(zeros, (size_t)N * sizeof(int32_t));
        poison(gout, nout * 2);
        poison(glse, nlse * sizeof(float));
        gpu->attention_fwd(gout, glse, gqkv, gz, B, T, nh, nkv, hd);
        float *z_out = h_act(gout, nout), *z_lse = h_f32(glse, nlse);
        check_bits("attention_fwd", shape, "zeros=NULL", z_out, h_out, nout * sizeof(float));
        check_bits("attention_fwd", shape, "lse zeros", z_lse, h_lse, nlse * sizeof(float));
        poison(gdqkv, nqkv * 2);
        gpu->attention_bwd(gdqkv, gdout, gqkv, go, gl, gz, B, T, nh, nkv, hd, 0.0f);
        float *z_dqkv = h_act(gdqkv, nqkv);
        check_bits("attention_bwd", shape, "zeros=NULL", z_dqkv, h_dqkv, nqkv * sizeof(float));
        poison(gdqkv, nqkv * 2);
        gpu->attention_bwd(gdqkv, gdout, gqkv, go, gl, gz, B, T, nh, nkv, hd, theta);
        float *z_rot = h_act(gdqkv, nqkv);
        check_bits("attention_bwd", shape, "rope zeros", z_rot, h_rot, nqkv * sizeof(float));
        gpu->free(gz);
        free(zeros), free(z_out), free(z_lse), free(z_dqkv), free(z_rot);
    }
    gpu->free(gdoc);
    free(doc);
    free(c_rot), free(h_rot), free(h_rot2), free(h_unf);
    gpu->free(gqkv), gpu->free(gout), gpu->free(glse), gpu->free(gdout), gpu->free(go);
    gpu->free(gdqkv), gpu->free(gl);
    free(qkv), free(c_out), free(c_lse), free(h_out), free(h_lse), free(dout), free(c_dqkv);
    free(h_dqkv);
}

/* ------------------------------------------------------------------ swiglu */
static void test_swiglu(int N, int F) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d F=%d", N, F);
    const size_t ngu = (size_t)N * 2 * F, nf = (size_t)N * F;
    float *gu = rnd_bf(ngu, 2.0), *dy = rnd_bf(nf, 1.0);
    float *c_out = xmalloc(nf * sizeof(float)), *c_dgu = xmalloc(ngu * sizeof(float));
    cpu->swiglu_fwd(c_out, gu, N, F);
    cpu->swiglu_bwd(c_dgu, dy, gu, N, F);
    void *ggu = g_act(gu, ngu), *gdy = g_act(dy, nf), *gout = gpu->alloc(nf * 2),
         *gdgu = gpu->alloc(ngu * 2);
    poison(gout, nf * 2);
    poison(gdgu, ngu * 2);
    gpu->swiglu_fwd(gout, ggu, N, F);
    gpu->swiglu_bwd(gdgu, gdy, ggu, N, F);
    float *h_out = h_act(gout, nf), *h_dgu = h_act(gdgu, ngu);
    check("swiglu_fwd", shape, "out", h_out, c_out, nf, TOL_BF16);
    check("swiglu_bwd", shape, "dgu", h_dgu, c_dgu, ngu, TOL_BF16);
    /* in place (dgu aliasing gu), as the cpu backend allows */
    gpu->swiglu_bwd(ggu, gdy, ggu, N, F);
    float *h_in = h_act(ggu, ngu);
    check("swiglu_bwd", shape, "in-place", h_in, c_dgu, ngu, TOL_BF16);
    gpu->free(ggu), gpu->free(gdy), gpu->free(gout), gpu->free(gdgu);
    free(gu), free(dy), free(c_out), free(c_dgu), free(h_out), free(h_dgu), free(h_in);
}

/* ------------------------------------------------------------------ cross-entropy */
static void test_xent(int N, int V, int with_grad, int in_place) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d V=%d%s", N, V,
             !with_grad ? " no-grad" : in_place ? " in-place" : "");
    const size_t n = (size_t)N * V;
    float *logits = rnd_bf(n, 3.0);
    int32_t *tgt = xmalloc((size_t)N * sizeof(int32_t));
    int valid = 0;
    for (int i = 0; i < N; i++) {
        tgt[i] = (rnd_u64() % 5 == 0) ? -1 : (int32_t)(rnd_u64() % (uint64_t)V);
        valid += tgt[i] >= 0;
    }
    const float dscale = valid ? 1.0f / (float)valid : 0.0f;
    float *c_loss = xmalloc((size_t)N * sizeof(float)), *c_dl = NULL;
    if (with_grad) c_dl = xmalloc(n * sizeof(float));
    cpu->xent_fwd_bwd(c_loss, c_dl, logits, tgt, N, V, dscale);
    void *gl = g_act(logits, n), *gd = NULL;
    int32_t *gt = g_bytes(tgt, (size_t)N * sizeof(int32_t));
    float *gloss = gpu->alloc((size_t)N * sizeof(float));
    poison(gloss, (size_t)N * sizeof(float));
    if (with_grad) {
        gd = in_place ? gl : gpu->alloc(n * 2);
        if (!in_place) poison(gd, n * 2);
    }
    gpu->xent_fwd_bwd(gloss, gd, gl, gt, N, V, dscale);
    float *h_loss = h_f32(gloss, N);
    check("xent_fwd_bwd", shape, "losses", h_loss, c_loss, N, TOL_F32);
    if (with_grad) {
        float *h_dl = h_act(gd, n);
        check("xent_fwd_bwd", shape, "dlogits", h_dl, c_dl, n, TOL_BF16);
        free(h_dl);
        if (!in_place) gpu->free(gd);
    }
    gpu->free(gl), gpu->free(gt), gpu->free(gloss);
    free(logits), free(tgt), free(c_loss), free(c_dl), free(h_loss);
}

/* A target outside the vocabulary cannot abort on the device: its loss must be NaN. */
static void test_xent_bad_target(void) {
    const int N = 2, V = 64;
    float *logits = rnd_bf((size_t)N * V, 1.0);
    int32_t tgt[2] = {3, V};
    void *gl = g_act(logits, (size_t)N * V);
    int32_t *gt = g_bytes(tgt, sizeof tgt);
    float *gloss = gpu->alloc(N * sizeof(float));
    gpu->xent_fwd_bwd(gloss, gl, gl, gt, N, V, 1.0f);
    float *h = h_f32(gloss, N);
    report("xent_fwd_bwd", "target >= V", "loss NaN", isnan(h[1]) && !isnan(h[0]) ? 0.0 : 1.0,
           0.0);
    gpu->free(gl), gpu->free(gt), gpu->free(gloss);
    free(logits), free(h);
}

/* ------------------------------------------------------------------ optimizer */
static void test_adamw(size_t n, int off) {
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu%s", n, off ? " unaligned" : "");
    const size_t na = n + 1;
    float *p = rnd_f(na, 0.02), *g = rnd_f(na, 0.01), *m = rnd_f(na, 1e-3), *v = rnd_f(na, 1e-3);
    for (size_t i = 0; i < na; i++) v[i] *= v[i]; /* second moments are >= 0 */
    float *gp = g_f32(p, na), *gg = g_f32(g, na), *gm = g_f32(m, na), *gv = g_f32(v, na);
    const int steps[2] = {1, 10};
    for (int s = 0; s < 2; s++) {
        cpu->adamw(p + off, g + off, m + off, v + off, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f,
                   steps[s]);
        gpu->adamw(gp + off, gg + off, gm + off, gv + off, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                   0.5f, steps[s]);
    }
    float *hp = h_f32(gp + off, n), *hm = h_f32(gm + off, n), *hv = h_f32(gv + off, n);
    /* same fp32 operations in the same order on both backends: bit-identical */
    check_bits("adamw", shape, "param", hp, p + off, n * sizeof(float));
    check_bits("adamw", shape, "m", hm, m + off, n * sizeof(float));
    check_bits("adamw", shape, "v", hv, v + off, n * sizeof(float));

    double ss_g = gpu->sum_squares(gp + off, n), ss_c = cpu->sum_squares(p + off, n);
    report("sum_squares", shape, "sum", fabs(ss_g - ss_c) / ss_c, 1e-12);

    gpu->accumulate(gm + off, gg + off, n); /* y += x */
    cpu->accumulate(m + off, g + off, n);
    float *ha = h_f32(gm + off, n);
    check_bits("accumulate", shape, "y", ha, m + off, n * sizeof(float));
    free(ha);
    gpu->free(gp), gpu->free(gg), gpu->free(gm), gpu->free(gv);
    free(p), free(g), free(m), free(v), free(hp), free(hm), free(hv);
}

/* ------------------------------------------------------------------ main */
int main(int argc, char **argv) {
    rng_state = argc > 1 ? strtoull(argv[1], NULL, 10) : 20251130u;
    g_only = argc > 2 ? argv[2] : NULL;
    printf("# reproduce: %s %llu%s%s\n", argv[0], (unsigned long long)rng_state,
           g_only ? " " : "", g_only ? g_only : "");
    if (!gpu->available()) {
        printf("# no CUDA device visible: skipped\n");
        return 77;
    }
    /* bind first, as a training rank does, before the backend makes its stream */
    const int ndev = gpu->device_count();
    gpu->set_device(0);
    printf("# %d CUDA device(s) visible; running on device 0\n", ndev);
    printf("# rel_l2 = |gpu - cpu|_2 / |cpu|_2 over the output; tol 0 means bit-identical\n");
    printf("# %-14s %-34s %-8s %10s %8s  %s\n", "op", "shape", "output", "rel_l2", "tol",
           "result");

    if (want("memory")) test_memory_convert();

    if (want("embedding")) {
        test_embedding(517, 200, 97);
        test_embedding(300, 75, 50);
        test_embedding(2048, 4096, 32000);
    }
    if (want("rmsnorm")) {
        test_rmsnorm(37, 129);
        test_rmsnorm(64, 256);
        test_rmsnorm(1024, 4096);
        test_rmsnorm(300, 2048); /* the register kernels: 256 threads, 1 group each */
        test_rmsnorm(257, 5120); /* 320 threads, 2 groups each */
        test_rmsnorm(600, 8192); /* 512 threads, 2 groups each */
    }
    if (want("matmul")) {
        test_matmul(33, 47, 65, 1);
        test_matmul(128, 256, 384, 0);
        test_matmul(256, 4096, 6144, 0);  /* fused QKV, GQA (32 q + 2·8 kv heads of 128) */
        test_matmul(128, 11008, 4096, 0); /* down_proj */
        test_matmul(64, 4096, 32000, 0);  /* lm_head */
    }
    if (want("rope")) {
        test_rope(2, 37, 4, 2, 10, 10000.0f);
        test_rope(2, 64, 8, 2, 128, 10000.0f);
        test_rope(2, 256, 4, 4, 64, 500000.0f);
    }
    if (want("attention") || want("attention-small")) {
        test_attention(2, 37, 4, 2, 32, -1, 0);
        test_attention(1, 100, 3, 1, 20, -1, 0); /* hd % 8 != 0: element-wise loads */
        test_attention(2, 129, 2, 1, 16, -1, 0);
        test_attention(1, 65, 2, 2, 100, -1, 0); /* padded to 128 */
        test_attention(1, 256, 4, 4, 64, -1, 0);
        test_attention(2, 300, 4, 1, 128, -1, 0);
        /* documents: several per tile, spanning tiles, single tokens, a start at T - 1 */
        test_attention(2, 37, 4, 2, 32, DOC_SHORT, 0);
        test_attention(1, 100, 3, 1, 20, DOC_FIXED, 7);
        test_attention(2, 129, 2, 1, 16, DOC_LAST, 40);
        test_attention(1, 256, 4, 4, 64, DOC_RANDOM, 70);
        test_attention(2, 300, 4, 1, 128, DOC_RANDOM, 100);
        test_attention(2, 300, 4, 2, 64, DOC_LAST, 150);
    }
    if (want("attention")) {
        test_attention(1, 1024, 8, 2, 128, -1, 0); /* Llama-like: GQA 4:1 */
        /* the backward's dS scratch holds 3 of these 5 sequences: passes of 3 and 2 */
        test_attention(5, 2048, 16, 16, 64, -1, 0);
        test_attention(1, 1024, 8, 2, 128, DOC_RANDOM, 300);
        test_attention(5, 2048, 16, 16, 64, DOC_FIXED, 512);
        test_attention(3, 1000, 8, 8, 128, DOC_RANDOM, 200);
    }
    if (want("swiglu")) {
        test_swiglu(13, 37);
        test_swiglu(256, 11008);
    }
    if (want("xent")) {
        test_xent(7, 1001, 1, 0);
        test_xent(64, 32000, 1, 1);
        test_xent(16, 32000, 0, 0);
        test_xent_bad_target();
    }
    if (want("adamw")) {
        test_adamw(1001, 1);
        test_adamw((1u << 22) + 3, 0);
    }
    if (n_checks == 0) {
        fprintf(stderr, "test_ops_cuda: no group named '%s'\n", g_only);
        return 2;
    }

    gpu->sync();
    printf("# %d checks, %d failed\n", n_checks, n_failed);
    return n_failed ? 1 : 0;
}
