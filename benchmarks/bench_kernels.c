/* Kernel microbenchmark of the cuda backend at Llama-2-7B shapes: every op's TFLOP/s or
 * GB/s against ceilings measured in the same run; a wrong result fails the run. */

/* Usage: bench_kernels [--mb N] [--iters N] [--only OP]
 * (--only: just the ops whose name contains OP, e.g. attention, after the ceilings)
 *
 * Shapes: N = 4096·mb tokens (mb sequences of T = 4096), d = 4096, F = 11008, nh = nkv = 32,
 * hd = 128, V = 32000, the lm_head/loss chunk of src/model/llama/llama.c (2^26 / V = 2097 rows), and
 * AdamW over one transformer block's parameters (202M). Ceilings, measured first: an
 * 8192³ bf16 cuBLASLt matmul (through the backend's own matmul_fwd) and a 1 GiB
 * device-to-device copy (bytes read + written).
 *
 * Each op runs once from a known state and its output is checked against the cpu
 * backend (row-wise ops on the whole tensor; matmuls on their first rows; attention on
 * the first 64 positions of sequence 0, whose results depend on nothing after them), then
 * runs 2 + iters times; the time is the median of the iters, each between CUDA events
 * on the backend's stream. Counted work: matmul 2·M·N·K FLOP (backward 4·M·N·K);
 * attention the causal pairs only, 4·hd per pair forward and 10·hd backward (the five
 * products of the standard count; the deterministic backward does seven), and with
 * documents of 512 tokens ("docs" rows: ops.h doc_start) only the pairs the mask keeps;
 * memory-bound
 * ops the fewest bytes they must move (each input read once, each output written once);
 * attention_decode (a KV-cache step: one new token per row after a full cache of 4096,
 * Llama-3-8B's 32 query / 8 kv heads) the K and V bytes of the cache, checked on row 0
 * against the cpu backend's decode.
 * FP8 (--only fp8, at --mb 2 the M = 8192 tokens of the usual 7B comparison): the quantize
 * kernels (bytes: bf16 in, codes out, scales) bit for bit against the cpu backend's
 * emulation, the FP8 weight ops (fp8_param_amax and fp8_param_cast from an fp32 weight,
 * fp8_transpose of codes; bytes: each input read and each output written once) bit for bit
 * against it too, and for each linear layer of a block its forward, dgrad and wgrad products
 * (ops.h's FP8 forms, M x N x K as matmul_fp8 sees them) in bf16 (bf16 ..., timed only: the
 * matmul rows above check the same products), fp8-tw (tensorwise, gradient operand e5m2)
 * and fp8-rw (rowwise, all e4m3), the forwards once more with fast accumulation (+fa;
 * a "#" line gives both forwards' rel_l2 against the cpu), each FP8 product checked on its
 * first rows against cpu matmul_fp8 on the GPU's own codes; a "(fallback)" row ran the
 * declared fallback kernel, not cuBLASLt.
 * Exit status: 0, or 1 when any check failed (the #wrong column), 77 when no GPU is visible. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#include "kernels/ops.h"

extern const shlm_ops shlm_ops_cuda;
static const shlm_ops *gpu = &shlm_ops_cuda, *cpu = &shlm_ops_cpu;

enum { D = 4096, FF = 11008, NH = 32, NKV = 32, HD = 128, SEQ = 4096, VOCAB = 32000 };

static int g_iters = 20;
static const char *g_only; /* --only: run just the ops whose name contains this */
static int want(const char *op) { return !g_only || strstr(op, g_only) != NULL; }
static int g_wrong_total;
static double g_ceil_tflops, g_ceil_gbs;

/* ------------------------------------------------------------------ host data */
static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* Device buffers are filled from one pool of 2^24 bf16-representable N(0,1) values:
 * element i of a buffer filled at offset `off` is pool[(off + i) mod 2^24], so the host
 * can rebuild any part of any input for the cpu check without keeping copies. */
#define POOL_BITS 24
#define POOL ((size_t)1 << POOL_BITS)
static float *g_pool;
static uint16_t *g_pool_bf;

static uint64_t rng_state = 20251130u;
static uint64_t rnd_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void pool_init(void) {
    g_pool = xmalloc(POOL * sizeof(float));
    g_pool_bf = xmalloc(POOL * sizeof(uint16_t));
    for (size_t i = 0; i < POOL; i += 2) {
        double u1 = 1.0 - (double)(rnd_u64() >> 11) * 0x1.0p-53;
        double u2 = (double)(rnd_u64() >> 11) * 0x1.0p-53, r = sqrt(-2.0 * log(u1));
        g_pool_bf[i] = shlm_f32_to_bf16((float)(r * cos(6.283185307179586 * u2)));
        g_pool_bf[i + 1] = shlm_f32_to_bf16((float)(r * sin(6.283185307179586 * u2)));
        g_pool[i] = shlm_bf16_to_f32(g_pool_bf[i]);
        g_pool[i + 1] = shlm_bf16_to_f32(g_pool_bf[i + 1]);
    }
}

/* host fp32 copy of elements [0, n) of a buffer filled at `off`, times `scale` */
static float *host_vals(size_t off, size_t n, float scale) {
    float *h = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = g_pool[(off + i) & (POOL - 1)] * scale;
    return h;
}

/* a bf16 act buffer of n elements filled at `off` */
static void fill_act(void *d, size_t n, size_t off) {
    for (size_t i = 0; i < n;) {
        size_t start = (off + i) & (POOL - 1), len = POOL - start;
        if (len > n - i) len = n - i;
        gpu->to_device((uint16_t *)d + i, g_pool_bf + start, len * sizeof(uint16_t));
        i += len;
    }
}
static void *dev_act(size_t n, size_t off) {
    void *d = gpu->alloc(n * 2);
    fill_act(d, n, off);
    return d;
}
static float *dev_f32_from(const float *h, size_t n) {
    float *d = gpu->alloc(n * sizeof(float));
    gpu->to_device(d, h, n * sizeof(float));
    return d;
}
static float *down_act(const void *d, size_t n) {
    uint16_t *b = xmalloc(n * 2);
    gpu->to_host(b, d, n * 2);
    float *h = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = shlm_bf16_to_f32(b[i]);
    free(b);
    return h;
}
static float *down_f32(const void *d, size_t n) {
    float *h = xmalloc(n * sizeof(float));
    gpu->to_host(h, d, n * sizeof(float));
    return h;
}

static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(ref[i])) return NAN;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
}
/* 1 (wrong) unless err < tol; NaN is wrong */
static int wrong(double err, double tol, const char *what) {
    int w = !(err < tol);
    if (w) fprintf(stderr, "# WRONG: %s rel_l2 %.3e (tol %.0e)\n", what, err, tol);
    return w;
}

/* ------------------------------------------------------------------ timing, output */
static cudaStream_t stream(void) { return (cudaStream_t)shlm_cuda_stream_handle(); }

static void cuda_ok(cudaError_t rc, const char *what) {
    if (rc != cudaSuccess) {
        fprintf(stderr, "bench_kernels: %s failed: %s\n", what, cudaGetErrorString(rc));
        exit(1);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* median microseconds of fn() over g_iters timed runs after 2 warm-ups */
static double time_us(void (*fn)(void)) {
    fn();
    fn();
    cudaEvent_t *ev = xmalloc(2 * (size_t)g_iters * sizeof(cudaEvent_t));
    double *t = xmalloc((size_t)g_iters * sizeof(double));
    for (int i = 0; i < 2 * g_iters; i++) cuda_ok(cudaEventCreate(&ev[i]), "cudaEventCreate");
    for (int i = 0; i < g_iters; i++) {
        cuda_ok(cudaEventRecord(ev[2 * i], stream()), "cudaEventRecord");
        fn();
        cuda_ok(cudaEventRecord(ev[2 * i + 1], stream()), "cudaEventRecord");
    }
    cuda_ok(cudaEventSynchronize(ev[2 * g_iters - 1]), "cudaEventSynchronize");
    for (int i = 0; i < g_iters; i++) {
        float ms = 0;
        cuda_ok(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
        t[i] = ms * 1e3;
    }
    for (int i = 0; i < 2 * g_iters; i++) cudaEventDestroy(ev[i]);
    qsort(t, (size_t)g_iters, sizeof(double), cmp_double);
    double med = t[g_iters / 2];
    free(ev);
    free(t);
    return med;
}

/* one output line; flops or bytes is 0 when the other one is the op's measure */
static void row(const char *op, const char *shape, double us, double flops, double bytes,
                int nwrong) {
    double tf = flops > 0 ? flops / us * 1e-6 : 0, gbs = bytes > 0 ? bytes / us * 1e-3 : 0;
    double pct = flops > 0 ? 100.0 * tf / g_ceil_tflops : 100.0 * gbs / g_ceil_gbs;
    char tfs[16] = "-", gbss[16] = "-", pcts[16] = "-";
    if (flops > 0) snprintf(tfs, sizeof tfs, "%.1f", tf);
    if (bytes > 0) snprintf(gbss, sizeof gbss, "%.0f", gbs);
    if (g_ceil_tflops > 0 && g_ceil_gbs > 0) snprintf(pcts, sizeof pcts, "%.1f", pct);
    printf("  %-22s %-30s %10.1f %9s %9s %9s %7d\n", op, shape, us, tfs, gbss, pcts, nwrong);
    fflush(stdout);
    g_wrong_total += nwrong;
}

/* ------------------------------------------------------------------ the ops */
/* the operands of the op being timed (fn() takes no arguments) */
static struct {
    void *a, *b, *c, *d, *e;
    float *f0, *f1, *f2, *f3;
    int32_t *tok, *doc;
    int N, C, OC, acc, B, T, V;
    size_t n;
} cur;

/* as the model runs them: the residual a separate input, both backward outputs "=" */
static void run_matmul_fwd(void) {
    gpu->matmul_fwd(cur.c, cur.a, cur.b, cur.N, cur.C, cur.OC, cur.acc ? cur.e : NULL);
}
static void run_matmul_bwd(void) {
    gpu->matmul_bwd(cur.d, cur.f0, cur.c, cur.a, cur.b, cur.N, cur.C, cur.OC,
                    SHLM_MM_SET_DINP | SHLM_MM_SET_DWEIGHT);
}
static void run_copy(void) { gpu->copy(cur.b, cur.a, cur.n); }

enum { CHECK_ROWS = 8 };

static void bench_matmul(const char *name, int N, int C, int OC, int acc) {
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%dx%d%s", N, C, OC, acc ? " +res" : "");
    const size_t nin = (size_t)N * C, nw = (size_t)OC * C, nout = (size_t)N * OC;
    cur.a = dev_act(nin, 11);
    cur.b = dev_act(nw, 2222);
    cur.c = dev_act(nout, 4);
    cur.e = dev_act(nout, 333333); /* the residual */
    cur.N = N, cur.C = C, cur.OC = OC, cur.acc = acc;
    run_matmul_fwd();
    /* check the first rows */
    float *x = host_vals(11, (size_t)CHECK_ROWS * C, 1.0f), *w = host_vals(2222, nw, 1.0f);
    float *ref = host_vals(333333, (size_t)CHECK_ROWS * OC, 1.0f);
    cpu->matmul_fwd(ref, x, w, CHECK_ROWS, C, OC, acc ? ref : NULL);
    float *got = down_act(cur.c, (size_t)CHECK_ROWS * OC);
    int nwrong = wrong(rel_l2(got, ref, (size_t)CHECK_ROWS * OC), 1e-2, name);
    free(x), free(w), free(ref), free(got);
    double us = time_us(run_matmul_fwd);
    char op[48];
    snprintf(op, sizeof op, "%s", name);
    row(op, shape, us, 2.0 * N * C * OC, 0, nwrong);
    gpu->free(cur.a), gpu->free(cur.b), gpu->free(cur.c), gpu->free(cur.e);
}

static void bench_matmul_bwd(const char *name, int N, int C, int OC) {
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%dx%d", N, C, OC);
    const size_t nin = (size_t)N * C, nw = (size_t)OC * C, nout = (size_t)N * OC;
    cur.a = dev_act(nin, 11);     /* inp */
    cur.b = dev_act(nw, 2222);    /* weight */
    cur.c = dev_act(nout, 44444); /* dout */
    cur.d = gpu->alloc(nin * 2);  /* dinp, from zero */
    cur.f0 = gpu->alloc(nw * sizeof(float));
    cur.N = N, cur.C = C, cur.OC = OC;
    run_matmul_bwd();
    /* dinp: first rows; dweight: first rows (output features) */
    float *dy = host_vals(44444, (size_t)CHECK_ROWS * OC, 1.0f), *w = host_vals(2222, nw, 1.0f);
    float *ref = calloc((size_t)CHECK_ROWS * C, sizeof(float));
    cpu->matmul_bwd(ref, NULL, dy, NULL, w, CHECK_ROWS, C, OC, 0);
    float *got = down_act(cur.d, (size_t)CHECK_ROWS * C);
    int nwrong = wrong(rel_l2(got, ref, (size_t)CHECK_ROWS * C), 1e-2, "matmul_bwd dinp");
    free(dy), free(w), free(ref), free(got);
    float *x = host_vals(11, nin, 1.0f), *dyf = host_vals(44444, nout, 1.0f);
    float *dys = xmalloc((size_t)N * CHECK_ROWS * sizeof(float));
    for (int i = 0; i < N; i++)
        memcpy(dys + (size_t)i * CHECK_ROWS, dyf + (size_t)i * OC, CHECK_ROWS * sizeof(float));
    float *refw = calloc((size_t)CHECK_ROWS * C, sizeof(float));
    cpu->matmul_bwd(NULL, refw, dys, x, NULL, N, C, CHECK_ROWS, 0);
    float *gotw = down_f32(cur.f0, (size_t)CHECK_ROWS * C);
    nwrong += wrong(rel_l2(gotw, refw, (size_t)CHECK_ROWS * C), 1e-4, "matmul_bwd dweight");
    free(x), free(dyf), free(dys), free(refw), free(gotw);
    double us = time_us(run_matmul_bwd);
    row(name, shape, us, 4.0 * N * C * OC, 0, nwrong);
    gpu->free(cur.a), gpu->free(cur.b), gpu->free(cur.c), gpu->free(cur.d), gpu->free(cur.f0);
}

/* RoPE's frequencies of the shapes above (theta 10000), made once in main as the model does */
static shlm_rope g_rope;

/* ---- attention: B sequences of T, nh = nkv = 32, hd = 128; cur.doc NULL (causal) or
 * documents of doc_len tokens (ops.h doc_start) */
static void run_att_fwd(void) {
    gpu->attention_fwd(cur.b, cur.f0, cur.a, cur.doc, cur.B, cur.T, NH, NKV, HD);
}
static void run_att_bwd(void) {
    gpu->attention_bwd(cur.d, cur.c, cur.a, cur.b, cur.f0, cur.doc, cur.B, cur.T, NH, NKV, HD,
                       NULL);
}
/* with the inverse RoPE of dq, dk fused (what the model runs) */
static void run_att_bwd_rope(void) {
    gpu->attention_bwd(cur.d, cur.c, cur.a, cur.b, cur.f0, cur.doc, cur.B, cur.T, NH, NKV, HD,
                       &g_rope);
}

/* doc_len 0: causal; else documents of doc_len tokens (the last one cut at T), FLOPs
 * counted over the (query, key) pairs the mask keeps. Checked: the 64 positions from w0
 * (0, or with documents the start of sequence 0's second), which depend on nothing before
 * w0 or after w0 + 63, against the cpu backend on those 64 tokens as a sequence of their
 * own (the rope rows need the true positions: checked only at w0 = 0). */
static void bench_attention(int B, int T, int doc_len) {
    const int N = B * T, C3 = (NH + 2 * NKV) * HD, CO = NH * HD, TC = 64;
    const int w0 = doc_len > 0 && doc_len + TC <= T ? doc_len : 0;
    char shape[64], name[32];
    snprintf(shape, sizeof shape, "B=%d T=%d nh=%d hd=%d", B, T, NH, HD);
    if (doc_len > 0)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), " doc=%d", doc_len);
    cur.a = dev_act((size_t)N * C3, 555);                          /* qkv */
    cur.b = gpu->alloc((size_t)N * CO * 2);                        /* out */
    cur.f0 = gpu->alloc((size_t)B * NH * T * sizeof(float));      /* lse */
    cur.c = dev_act((size_t)N * CO, 6666);                         /* dout */
    cur.d = gpu->alloc((size_t)N * C3 * 2);                        /* dqkv */
    cur.B = B, cur.T = T;
    cur.doc = NULL;
    double pairs = (double)B * NH * ((double)T * (T + 1) / 2);
    if (doc_len > 0) {
        int32_t *doc = xmalloc((size_t)N * sizeof(int32_t));
        pairs = 0;
        for (int i = 0; i < N; i++) {
            const int t = i % T, start = t - t % doc_len;
            doc[i] = start;
            pairs += (double)NH * (t - start + 1);
        }
        cur.doc = gpu->alloc((size_t)N * sizeof(int32_t));
        gpu->to_device(cur.doc, doc, (size_t)N * sizeof(int32_t));
        free(doc);
    }
    const char *sfx = doc_len > 0 ? " docs" : "";

    run_att_fwd();
    float *qkv = host_vals(555 + (size_t)w0 * C3, (size_t)TC * C3, 1.0f);
    float *ref = xmalloc((size_t)TC * CO * sizeof(float)), *rl = xmalloc((size_t)NH * TC * sizeof(float));
    cpu->attention_fwd(ref, rl, qkv, NULL, 1, TC, NH, NKV, HD);
    void *got_rows = (uint16_t *)cur.b + (size_t)w0 * CO;
    float *got = down_act(got_rows, (size_t)TC * CO);
    snprintf(name, sizeof name, "attention_fwd%s", sfx);
    int nwrong = wrong(rel_l2(got, ref, (size_t)TC * CO), 1e-2, name);
    double us = time_us(run_att_fwd);
    row(name, shape, us, 4.0 * HD * pairs, 0, nwrong);

    run_att_fwd(); /* out and lse as the backward expects them */
    run_att_bwd();
    /* dq of the 64 positions: their own keys, lse and D only; out and lse are the GPU's */
    float *out = down_act(got_rows, (size_t)TC * CO), *lse_all = down_f32(cur.f0, (size_t)NH * T);
    float *lse = xmalloc((size_t)NH * TC * sizeof(float));
    for (int h = 0; h < NH; h++)
        memcpy(lse + (size_t)h * TC, lse_all + (size_t)h * T + w0, TC * sizeof(float));
    float *dout = host_vals(6666 + (size_t)w0 * CO, (size_t)TC * CO, 1.0f);
    float *rdq = xmalloc((size_t)TC * C3 * sizeof(float));
    cpu->attention_bwd(rdq, dout, qkv, out, lse, NULL, 1, TC, NH, NKV, HD, NULL);
    void *gdq_rows = (uint16_t *)cur.d + (size_t)w0 * C3;
    float *gdq = down_act(gdq_rows, (size_t)TC * C3);
    float *a = xmalloc((size_t)TC * CO * sizeof(float)), *r = xmalloc((size_t)TC * CO * sizeof(float));
    for (int i = 0; i < TC; i++) {
        memcpy(a + (size_t)i * CO, gdq + (size_t)i * C3, CO * sizeof(float));
        memcpy(r + (size_t)i * CO, rdq + (size_t)i * C3, CO * sizeof(float));
    }
    snprintf(name, sizeof name, "attention_bwd%s", sfx);
    nwrong = wrong(rel_l2(a, r, (size_t)TC * CO), 2e-2, name);
    us = time_us(run_att_bwd);
    row(name, shape, us, 10.0 * HD * pairs, 0, nwrong);
    /* the same with RoPE: its time minus the row above is what the fused inverse
     * RoPE costs, against the "rope (inverse)" row it replaces; dq of positions 0..63
     * against cpu attention_bwd then cpu rope (positions row % 64 = the gpu's) */
    run_att_bwd_rope();
    nwrong = 0;
    if (w0 == 0) {
        cpu->attention_bwd(rdq, dout, qkv, out, lse, NULL, 1, TC, NH, NKV, HD, &g_rope);
        free(gdq);
        gdq = down_act(gdq_rows, (size_t)TC * C3);
        for (int i = 0; i < TC; i++) {
            memcpy(a + (size_t)i * CO, gdq + (size_t)i * C3, CO * sizeof(float));
            memcpy(r + (size_t)i * CO, rdq + (size_t)i * C3, CO * sizeof(float));
        }
        nwrong = wrong(rel_l2(a, r, (size_t)TC * CO), 2e-2, "attention_bwd+rope dq");
    }
    snprintf(name, sizeof name, "attention_bwd+rope%s", sfx);
    us = time_us(run_att_bwd_rope);
    row(name, shape, us, 10.0 * HD * pairs, 0, nwrong);
    free(qkv), free(ref), free(rl), free(got), free(out), free(lse_all), free(lse), free(dout);
    free(rdq), free(gdq), free(a), free(r);
    gpu->free(cur.a), gpu->free(cur.b), gpu->free(cur.c), gpu->free(cur.d), gpu->free(cur.f0);
    gpu->free(cur.doc);
    cur.doc = NULL;
}

/* ---- memory-bound ops, checked whole on the cpu */
static void run_rms_fwd(void) { gpu->rmsnorm_fwd(cur.b, cur.f0, cur.a, cur.c, cur.N, cur.C, 1e-5f, NULL); }
static void run_rms_bwd(void) {
    gpu->rmsnorm_bwd(cur.d, cur.f1, cur.e, cur.a, cur.c, cur.f0, cur.N, cur.C);
}

static void bench_rmsnorm(int N, int C) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
    const size_t n = (size_t)N * C;
    cur.a = dev_act(n, 77);            /* inp */
    cur.c = dev_act(C, 888);           /* weight */
    cur.b = gpu->alloc(n * 2);         /* out */
    cur.f0 = gpu->alloc((size_t)N * 4); /* rstd */
    cur.N = N, cur.C = C;
    run_rms_fwd();
    float *x = host_vals(77, n, 1.0f), *w = host_vals(888, C, 1.0f);
    float *ref = xmalloc(n * sizeof(float)), *rstd = xmalloc((size_t)N * sizeof(float));
    cpu->rmsnorm_fwd(ref, rstd, x, w, N, C, 1e-5f, NULL);
    float *got = down_act(cur.b, n);
    int nwrong = wrong(rel_l2(got, ref, n), 1e-2, "rmsnorm_fwd");
    double us = time_us(run_rms_fwd);
    row("rmsnorm_fwd", shape, us, 0, 2.0 * n * 2 + C * 2 + N * 4.0, nwrong);

    cur.e = dev_act(n, 999);            /* dout */
    cur.d = gpu->alloc(n * 2);          /* dinp, from zero */
    cur.f1 = gpu->alloc((size_t)C * 4); /* dweight */
    gpu->to_device(cur.f0, rstd, (size_t)N * 4);
    run_rms_bwd();
    float *dy = host_vals(999, n, 1.0f), *dx = calloc(n, sizeof(float)), *dw = calloc(C, sizeof(float));
    cpu->rmsnorm_bwd(dx, dw, dy, x, w, rstd, N, C);
    float *gdx = down_act(cur.d, n), *gdw = down_f32(cur.f1, C);
    nwrong = wrong(rel_l2(gdx, dx, n), 1e-2, "rmsnorm_bwd dinp") +
             wrong(rel_l2(gdw, dw, C), 1e-4, "rmsnorm_bwd dweight");
    us = time_us(run_rms_bwd);
    /* read dout, inp, dinp; write dinp */
    row("rmsnorm_bwd", shape, us, 0, 4.0 * n * 2 + C * 2 + N * 4.0, nwrong);
    free(x), free(w), free(ref), free(rstd), free(got), free(dy), free(dx), free(dw), free(gdx);
    free(gdw);
    gpu->free(cur.a), gpu->free(cur.b), gpu->free(cur.c), gpu->free(cur.d), gpu->free(cur.e);
    gpu->free(cur.f0), gpu->free(cur.f1);
}

static void run_rope(void) {
    gpu->rope(cur.a, cur.N, cur.T, (NH + 2 * NKV) * HD, NH + NKV, &g_rope, NULL, cur.acc);
}

/* ---- KV-cache decode: cur.B rows of one new token each after cur.T - 1 cached ones */
enum { DEC_NKV = 8 };
static void run_decode(void) {
    gpu->attention_decode(cur.b, cur.c, cur.d, cur.a, cur.tok, cur.B, 1, cur.T, NH, DEC_NKV, HD);
}

static void bench_decode(int B, int cap) {
    const int C3 = (NH + 2 * DEC_NKV) * HD, CO = NH * HD;
    const size_t row_cache = (size_t)DEC_NKV * cap * HD, ncache = (size_t)B * row_cache;
    char shape[64];
    snprintf(shape, sizeof shape, "B=%d ctx=%d nh=%d nkv=%d", B, cap, NH, DEC_NKV);
    cur.a = dev_act((size_t)B * C3, 777);   /* the new tokens' qkv */
    cur.b = gpu->alloc((size_t)B * CO * 2); /* out */
    cur.c = dev_act(ncache, 8888);          /* k cache */
    cur.d = dev_act(ncache, 99999);         /* v cache */
    int32_t *pos = xmalloc((size_t)B * sizeof(int32_t));
    for (int b = 0; b < B; b++) pos[b] = cap - 1;
    cur.tok = gpu->alloc((size_t)B * sizeof(int32_t));
    gpu->to_device(cur.tok, pos, (size_t)B * sizeof(int32_t));
    cur.B = B, cur.T = cap;
    run_decode();
    float *qkv = host_vals(777, (size_t)C3, 1.0f), *kc = host_vals(8888, row_cache, 1.0f);
    float *vc = host_vals(99999, row_cache, 1.0f), *ref = xmalloc((size_t)CO * sizeof(float));
    cpu->attention_decode(ref, kc, vc, qkv, pos, 1, 1, cap, NH, DEC_NKV, HD);
    float *got = down_act(cur.b, (size_t)CO);
    int nwrong = wrong(rel_l2(got, ref, (size_t)CO), 1e-2, "attention_decode");
    double us = time_us(run_decode);
    row("attention_decode", shape, us, 0, 2.0 * ncache * 2, nwrong);
    free(qkv), free(kc), free(vc), free(ref), free(got), free(pos);
    gpu->free(cur.a), gpu->free(cur.b), gpu->free(cur.c), gpu->free(cur.d), gpu->free(cur.tok);
}

static void bench_rope(int N, int T, int inverse) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d heads=%d hd=%d", N, NH + NKV, HD);
    const size_t n = (size_t)N * (NH + 2 * NKV) * HD;
    cur.a = dev_act(n, 1212);
    cur.N = N, cur.T = T, cur.acc = inverse;
    run_rope();
    float *ref = host_vals(1212, n, 1.0f);
    cpu->rope(ref, N, T, (NH + 2 * NKV) * HD, NH + NKV, &g_rope, NULL, inverse);
    float *got = down_act(cur.a, n);
    int nwrong = wrong(rel_l2(got, ref, n), 1e-2, "rope");
    double us = time_us(run_rope);
    row(inverse ? "rope (inverse)" : "rope", shape, us, 0,
        2.0 * N * (NH + NKV) * HD * 2, nwrong);
    free(ref), free(got);
    gpu->free(cur.a);
}

static void run_swiglu_fwd(void) { gpu->swiglu_fwd(cur.b, cur.a, cur.N, cur.C, NULL); }
static void run_swiglu_bwd(void) { gpu->swiglu_bwd(cur.d, cur.c, cur.a, cur.N, cur.C, NULL); }

static void bench_swiglu(int N, int F) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d F=%d", N, F);
    const size_t ngu = (size_t)N * 2 * F, nf = (size_t)N * F;
    cur.a = dev_act(ngu, 3434);
    cur.b = gpu->alloc(nf * 2);
    cur.c = dev_act(nf, 5656);
    cur.d = gpu->alloc(ngu * 2);
    cur.N = N, cur.C = F;
    run_swiglu_fwd();
    run_swiglu_bwd();
    float *gu = host_vals(3434, ngu, 1.0f), *dy = host_vals(5656, nf, 1.0f);
    float *ref = xmalloc(nf * sizeof(float)), *rdgu = xmalloc(ngu * sizeof(float));
    cpu->swiglu_fwd(ref, gu, N, F, NULL);
    cpu->swiglu_bwd(rdgu, dy, gu, N, F, NULL);
    float *got = down_act(cur.b, nf), *gdgu = down_act(cur.d, ngu);
    int w1 = wrong(rel_l2(got, ref, nf), 1e-2, "swiglu_fwd");
    int w2 = wrong(rel_l2(gdgu, rdgu, ngu), 1e-2, "swiglu_bwd");
    double us = time_us(run_swiglu_fwd);
    row("swiglu_fwd", shape, us, 0, (ngu + nf) * 2.0, w1);
    us = time_us(run_swiglu_bwd);
    row("swiglu_bwd", shape, us, 0, (2.0 * ngu + nf) * 2.0, w2);
    free(gu), free(dy), free(ref), free(rdgu), free(got), free(gdgu);
    gpu->free(cur.a), gpu->free(cur.b), gpu->free(cur.c), gpu->free(cur.d);
}

static void run_xent(void) {
    gpu->xent_fwd_bwd(cur.f0, cur.a, cur.a, cur.tok, cur.N, cur.V, 1.0f / (float)cur.N);
}

static void bench_xent(int N, int V) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d V=%d in-place", N, V);
    const size_t n = (size_t)N * V;
    int32_t *tgt = xmalloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) tgt[i] = (int32_t)(rnd_u64() % (uint64_t)V);
    cur.a = dev_act(n, 7878);
    cur.tok = gpu->alloc((size_t)N * sizeof(int32_t));
    gpu->to_device(cur.tok, tgt, (size_t)N * sizeof(int32_t));
    cur.f0 = gpu->alloc((size_t)N * sizeof(float));
    cur.N = N, cur.V = V;
    run_xent();
    float *x = host_vals(7878, n, 1.0f), *loss = xmalloc((size_t)N * sizeof(float));
    cpu->xent_fwd_bwd(loss, x, x, tgt, N, V, 1.0f / (float)N);
    float *got = down_act(cur.a, n), *gl = down_f32(cur.f0, N);
    int nwrong = wrong(rel_l2(gl, loss, N), 1e-4, "xent losses") +
                 wrong(rel_l2(got, x, n), 1e-2, "xent dlogits");
    double us = time_us(run_xent);
    row("xent_fwd_bwd", shape, us, 0, 2.0 * n * 2, nwrong);
    free(tgt), free(x), free(loss), free(got), free(gl);
    gpu->free(cur.a), gpu->free(cur.tok), gpu->free(cur.f0);
}

static void run_emb_fwd(void) { gpu->embedding_fwd(cur.b, cur.tok, cur.a, cur.N, cur.C); }
static void run_emb_bwd(void) { gpu->embedding_bwd(cur.f0, cur.c, cur.tok, cur.N, cur.C); }

static void bench_embedding(int N, int C, int V) {
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d V=%d", N, C, V);
    int32_t *tok = xmalloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rnd_u64() % (uint64_t)V);
    cur.tok = gpu->alloc((size_t)N * sizeof(int32_t));
    gpu->to_device(cur.tok, tok, (size_t)N * sizeof(int32_t));
    cur.a = dev_act((size_t)V * C, 9090);            /* wte */
    cur.b = gpu->alloc((size_t)N * C * 2);           /* out */
    cur.c = dev_act((size_t)N * C, 1313);            /* dout */
    cur.f0 = gpu->alloc((size_t)V * C * sizeof(float)); /* dwte, from zero */
    cur.N = N, cur.C = C;
    run_emb_fwd();
    run_emb_bwd();
    float *wte = host_vals(9090, (size_t)V * C, 1.0f), *ref = xmalloc((size_t)N * C * sizeof(float));
    cpu->embedding_fwd(ref, tok, wte, N, C);
    float *got = down_act(cur.b, (size_t)N * C);
    int w1 = wrong(rel_l2(got, ref, (size_t)N * C), 1e-6, "embedding_fwd");
    float *dout = host_vals(1313, (size_t)N * C, 1.0f), *dw = calloc((size_t)V * C, sizeof(float));
    cpu->embedding_bwd(dw, dout, tok, N, C);
    float *gdw = down_f32(cur.f0, (size_t)V * C);
    int w2 = wrong(rel_l2(gdw, dw, (size_t)V * C), 1e-6, "embedding_bwd");
    double us = time_us(run_emb_fwd);
    row("embedding_fwd", shape, us, 0, 2.0 * N * C * 2 + N * 4.0, w1);
    us = time_us(run_emb_bwd);
    /* read dout and the touched dwte rows, write those rows */
    row("embedding_bwd", shape, us, 0, (double)N * C * (2 + 4 + 4) + N * 4.0, w2);
    free(tok), free(wte), free(ref), free(got), free(dout), free(dw), free(gdw);
    gpu->free(cur.tok), gpu->free(cur.a), gpu->free(cur.b), gpu->free(cur.c), gpu->free(cur.f0);
}

static void run_f32_to_act(void) { gpu->f32_to_act(cur.a, cur.f0, cur.n); }

static void bench_convert(size_t n) {
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    float *ref = host_vals(2424, n, 1.0f);
    cur.a = gpu->alloc(n * 2);
    cur.f0 = dev_f32_from(ref, n);
    cur.n = n;
    run_f32_to_act();
    float *got = down_act(cur.a, n);
    shlm_cpu_round_to_bf16(ref, n);
    int nwrong = memcmp(got, ref, n * sizeof(float)) != 0;
    if (nwrong) fprintf(stderr, "# WRONG: f32_to_act differs from the cpu's rounding\n");
    double us = time_us(run_f32_to_act);
    row("f32_to_act", shape, us, 0, n * 6.0, nwrong);
    free(ref), free(got);
    gpu->free(cur.a), gpu->free(cur.f0);
}

static void run_adamw(void) {
    gpu->adamw(cur.f0, cur.f1, cur.f2, cur.f3, cur.n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10, NULL);
}
static double g_ss;
static void run_sum_squares(void) { g_ss = gpu->sum_squares(cur.f1, cur.n); }
static void run_accumulate(void) { gpu->accumulate(cur.f2, cur.f1, cur.n); }

static void bench_optimizer(size_t n) {
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    float *p = host_vals(111, n, 0.02f), *g = host_vals(222, n, 0.01f);
    float *m = host_vals(333, n, 1e-3f), *v = host_vals(444, n, 1e-3f);
    for (size_t i = 0; i < n; i++) v[i] *= v[i];
    cur.f0 = dev_f32_from(p, n), cur.f1 = dev_f32_from(g, n);
    cur.f2 = dev_f32_from(m, n), cur.f3 = dev_f32_from(v, n);
    cur.n = n;
    run_adamw();
    cpu->adamw(p, g, m, v, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10, NULL);
    float *gp = down_f32(cur.f0, n);
    int nwrong = memcmp(gp, p, n * sizeof(float)) != 0;
    if (nwrong) fprintf(stderr, "# WRONG: adamw differs from the cpu's (rel_l2 %.3e)\n", rel_l2(gp, p, n));
    double us = time_us(run_adamw);
    row("adamw", shape, us, 0, 28.0 * n, nwrong);
    free(gp);

    run_sum_squares();
    double ref = cpu->sum_squares(g, n);
    nwrong = wrong(fabs(g_ss - ref) / ref, 1e-10, "sum_squares");
    us = time_us(run_sum_squares); /* includes the copy of the result to the host */
    row("sum_squares", shape, us, 0, 4.0 * n, nwrong);

    gpu->to_device(cur.f2, m, n * sizeof(float)); /* the cpu's m after its step */
    run_accumulate();
    cpu->accumulate(m, g, n);
    float *gm = down_f32(cur.f2, n);
    nwrong = memcmp(gm, m, n * sizeof(float)) != 0;
    if (nwrong) fprintf(stderr, "# WRONG: accumulate differs from the cpu's\n");
    free(gm);
    us = time_us(run_accumulate);
    row("accumulate", shape, us, 0, 12.0 * n, nwrong);
    free(p), free(g), free(m), free(v);
    gpu->free(cur.f0), gpu->free(cur.f1), gpu->free(cur.f2), gpu->free(cur.f3);
}

/* ---- FP8 (ops.h "FP8"): the quantize kernels' GB/s and the scaled TN products' TFLOP/s
 * at the blocks' linear layers, each form beside its bf16 product. Checked against the
 * cpu backend: quantize bit for bit (codes and scale_inv, the whole matrix; any NaN code
 * matches any NaN), the products on their first rows from the GPU's own codes. */
static shlm_fp8_matrix cur_qa, cur_qb; /* matmul_fp8's operands */
static int cur_transpose;
static void run_fp8_quantize(void) { gpu->fp8_quantize(&cur_qa, cur.a, cur_transpose); }
static int cur_fp8_flags; /* matmul_fp8's */
static void run_matmul_fp8(void) { gpu->matmul_fp8(cur.c, cur_fp8_flags, &cur_qa, &cur_qb, cur.acc & 1 ? cur.e : NULL); }

static const char *fp8_name(shlm_fp8_format f) { return f == SHLM_FP8_E5M2 ? "e5m2" : "e4m3"; }

/* a device fp8 matrix of rows x cols, or its host twin (NULL: device) */
static shlm_fp8_matrix fp8_matrix(int rows, int cols, shlm_fp8_format f, shlm_fp8_scaling s,
                                  int host) {
    const size_t n = (size_t)rows * cols, ns = (size_t)(s == SHLM_FP8_ROWWISE ? rows : 1);
    shlm_fp8_matrix q = {host ? xmalloc(n) : gpu->alloc(n),
                         host ? xmalloc(ns * sizeof(float)) : gpu->alloc(ns * sizeof(float)),
                         rows, cols, f, s};
    return q;
}
static size_t fp8_nscales(const shlm_fp8_matrix *q) {
    return q->scaling == SHLM_FP8_ROWWISE ? (size_t)q->rows : 1;
}
static void fp8_free(shlm_fp8_matrix *q, int host) {
    if (host) free(q->codes), free(q->scale_inv);
    else gpu->free(q->codes), gpu->free(q->scale_inv);
}
static int fp8_is_nan(shlm_fp8_format f, uint8_t c) {
    return f == SHLM_FP8_E4M3 ? (c & 0x7F) == 0x7F : (c & 0x7F) > 0x7C;
}
/* 1 (and a WRONG line) when the cpu backend has no FP8 emulation to check against */
static int fp8_no_reference(const char *what) {
    if (cpu->fp8_quantize && cpu->matmul_fp8 && cpu->fp8_param_amax && cpu->fp8_param_scale &&
        cpu->fp8_param_cast && cpu->fp8_transpose)
        return 0;
    fprintf(stderr, "# WRONG: %s: the cpu backend has no FP8 emulation (fp8_quantize, "
            "matmul_fp8, fp8_param_*, fp8_transpose) to check against\n", what);
    return 1;
}

/* quantize src (rows x cols, or cols x rows transposed into q) filled at `off` */
static void bench_fp8_quantize(const char *name, int rows, int cols, shlm_fp8_format f,
                               shlm_fp8_scaling s, int transpose, size_t off) {
    char shape[64];
    snprintf(shape, sizeof shape, "%s %dx%d %s%s", transpose ? "srcT" : "src",
             transpose ? cols : rows, transpose ? rows : cols, fp8_name(f),
             s == SHLM_FP8_ROWWISE ? " rw" : " tw");
    const size_t n = (size_t)rows * cols;
    cur.a = dev_act(n, off);
    cur_qa = fp8_matrix(rows, cols, f, s, 0);
    cur_transpose = transpose;
    run_fp8_quantize();
    int nwrong = fp8_no_reference(name);
    if (!nwrong) {
        shlm_fp8_matrix h = fp8_matrix(rows, cols, f, s, 1);
        float *src = host_vals(off, n, 1.0f);
        cpu->fp8_quantize(&h, src, transpose);
        free(src);
        uint8_t *got = xmalloc(n);
        const size_t ns = fp8_nscales(&h);
        float *gs = xmalloc(ns * sizeof(float));
        gpu->to_host(got, cur_qa.codes, n);
        gpu->to_host(gs, cur_qa.scale_inv, ns * sizeof(float));
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++)
            if (got[i] != h.codes[i] && !(fp8_is_nan(f, got[i]) && fp8_is_nan(f, h.codes[i])))
                if (!bad++) first = i;
        if (bad)
            fprintf(stderr, "# WRONG: %s: %zu codes differ from the cpu's, the first at %zu "
                    "(0x%02x, cpu 0x%02x)\n", name, bad, first, got[first], h.codes[first]);
        const int sbad = memcmp(gs, h.scale_inv, ns * sizeof(float)) != 0;
        if (sbad) fprintf(stderr, "# WRONG: %s: scale_inv differs from the cpu's\n", name);
        nwrong = bad > 0 || sbad;
        free(got), free(gs);
        fp8_free(&h, 1);
    }
    double us = time_us(run_fp8_quantize);
    row(name, shape, us, 0, n * 3.0 + fp8_nscales(&cur_qa) * 4.0, nwrong);
    fp8_free(&cur_qa, 0);
    gpu->free(cur.a);
}

/* both layouts of src (rows x cols) from fp8_quantize_both, checked bit for bit against the
 * GPU's two fp8_quantize calls (which bench_fp8_quantize checks against the cpu's); counted
 * at 4 bytes an element: src read once, both codes written */
static shlm_fp8_matrix cur_qt;
static void run_fp8_quantize_both(void) { gpu->fp8_quantize_both(&cur_qa, &cur_qt, cur.a, NULL); }
static void bench_fp8_quantize_both(const char *name, int rows, int cols, shlm_fp8_format f,
                                    shlm_fp8_scaling s, size_t off) {
    char shape[64];
    snprintf(shape, sizeof shape, "src %dx%d %s%s", rows, cols, fp8_name(f),
             s == SHLM_FP8_ROWWISE ? " rw" : " tw");
    const size_t n = (size_t)rows * cols;
    cur.a = dev_act(n, off);
    cur_qa = fp8_matrix(rows, cols, f, s, 0);
    cur_qt = fp8_matrix(cols, rows, f, s, 0);
    run_fp8_quantize_both();
    shlm_fp8_matrix one = fp8_matrix(rows, cols, f, s, 0), one_t = fp8_matrix(cols, rows, f, s, 0);
    gpu->fp8_quantize(&one, cur.a, 0);
    gpu->fp8_quantize(&one_t, cur.a, 1);
    const shlm_fp8_matrix *got[] = {&cur_qa, &cur_qt}, *want[] = {&one, &one_t};
    int nwrong = 0;
    uint8_t *g = xmalloc(n), *w = xmalloc(n);
    for (int k = 0; k < 2; k++) {
        const size_t ns = fp8_nscales(got[k]);
        float gs[1], ws[1];
        gpu->to_host(g, got[k]->codes, n);
        gpu->to_host(w, want[k]->codes, n);
        int bad = memcmp(g, w, n) != 0;
        if (ns == 1) {
            gpu->to_host(gs, got[k]->scale_inv, sizeof(float));
            gpu->to_host(ws, want[k]->scale_inv, sizeof(float));
            bad |= gs[0] != ws[0];
        }
        if (bad) fprintf(stderr, "# WRONG: %s: %s layout differs from fp8_quantize's\n", name,
                         k ? "the transposed" : "src's");
        nwrong += bad;
    }
    free(g), free(w);
    fp8_free(&one, 0), fp8_free(&one_t, 0);
    double us = time_us(run_fp8_quantize_both);
    row(name, shape, us, 0, n * 4.0, nwrong);
    fp8_free(&cur_qa, 0), fp8_free(&cur_qt, 0);
    gpu->free(cur.a);
}

/* FP8 weights from an fp32 weight (rows x cols, filled from the pool at `off` times 0.02,
 * so most values are not bf16): fp8_param_amax, then fp8_param_cast with round_bf16 = 1
 * (the values a bf16 gather gives), checked bit for bit against the cpu backend's
 * fp8_param_amax, _scale and _cast (amax, scale_inv, codes). amax counted at 4 bytes an
 * element (fp32 read), the cast at 5 (fp32 read, code written). */
static float *cur_amax;
static void run_fp8_param_amax(void) { gpu->fp8_param_amax(cur_amax, cur.f0, cur.n); }
static void run_fp8_param_cast(void) { gpu->fp8_param_cast(cur.a, cur.f0, cur.n, cur_amax, 1); }
static void bench_fp8_param(int rows, int cols, size_t off) {
    char shape[64];
    snprintf(shape, sizeof shape, "W %dx%d fp32 e4m3", rows, cols);
    const size_t n = (size_t)rows * cols;
    float *h = host_vals(off, n, 0.02f);
    cur.f0 = dev_f32_from(h, n);
    cur.n = n;
    cur.a = gpu->alloc(n);
    cur_amax = gpu->alloc(sizeof(float));
    float *sinv = gpu->alloc(sizeof(float));
    gpu->zero(cur_amax, sizeof(float));
    run_fp8_param_amax();
    gpu->fp8_param_scale(sinv, cur_amax, 1);
    run_fp8_param_cast();
    float ca = 0.0f, cs, ga, gs;
    uint8_t *cc = xmalloc(n), *got = xmalloc(n);
    cpu->fp8_param_amax(&ca, h, n);
    cpu->fp8_param_scale(&cs, &ca, 1);
    cpu->fp8_param_cast(cc, h, n, &ca, 1);
    gpu->to_host(&ga, cur_amax, sizeof ga);
    gpu->to_host(&gs, sinv, sizeof gs);
    gpu->to_host(got, cur.a, n);
    const int amax_bad = memcmp(&ga, &ca, sizeof ga) != 0;
    if (amax_bad) fprintf(stderr, "# WRONG: fp8_param_amax %g, the cpu's %g\n", (double)ga, (double)ca);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != cc[i] && !bad++) first = i;
    if (bad)
        fprintf(stderr, "# WRONG: fp8_param_cast: %zu codes differ from the cpu's, the first at %zu "
                "(0x%02x, cpu 0x%02x)\n", bad, first, got[first], cc[first]);
    const int sbad = memcmp(&gs, &cs, sizeof gs) != 0;
    if (sbad) fprintf(stderr, "# WRONG: fp8_param_scale %a, the cpu's %a\n", (double)gs, (double)cs);
    double us = time_us(run_fp8_param_amax); /* the maximum again: *amax stays what it is */
    row("fp8_param_amax", shape, us, 0, n * 4.0, amax_bad);
    us = time_us(run_fp8_param_cast);
    row("fp8_param_cast", shape, us, 0, n * 5.0, bad > 0 || sbad);
    free(h), free(cc), free(got);
    gpu->free(cur.f0), gpu->free(cur.a), gpu->free(cur_amax), gpu->free(sinv);
}

/* dst (cols x rows) = srcᵀ over codes (bytes from the pool's bf16 bits at `off`), checked
 * against the cpu's fp8_transpose; counted at 2 bytes an element (read and written once) */
static void run_fp8_transpose(void) { gpu->fp8_transpose(cur.b, cur.a, cur.N, cur.C); }
static void bench_fp8_transpose(int rows, int cols, size_t off) {
    char shape[64];
    snprintf(shape, sizeof shape, "codes %dx%d", rows, cols);
    const size_t n = (size_t)rows * cols;
    uint8_t *h = xmalloc(n), *want = xmalloc(n), *got = xmalloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)g_pool_bf[(off + i) & (POOL - 1)];
    cur.a = gpu->alloc(n), cur.b = gpu->alloc(n);
    cur.N = rows, cur.C = cols;
    gpu->to_device(cur.a, h, n);
    run_fp8_transpose();
    cpu->fp8_transpose(want, h, rows, cols);
    gpu->to_host(got, cur.b, n);
    const int nwrong = memcmp(got, want, n) != 0;
    if (nwrong) fprintf(stderr, "# WRONG: fp8_transpose %s differs from the cpu's\n", shape);
    double us = time_us(run_fp8_transpose);
    row("fp8_transpose", shape, us, 0, n * 2.0, nwrong);
    free(h), free(want), free(got);
    gpu->free(cur.a), gpu->free(cur.b);
}

/* out(M,N) = q(a)·q(b)ᵀ (a filled at off_a, b at off_b, both quantized on the GPU without
 * transposing: the product sees K-contiguous codes either way), flags: 1 adds c (the
 * residual), 2 writes fp32. Checked: the first rows against cpu matmul_fp8 on the same
 * codes and scales. */
static double bench_fp8_gemm(const char *name, int M, int N, int K, shlm_fp8_format fa,
                             shlm_fp8_format fb, shlm_fp8_scaling s, int flags, int fast_accum,
                             double *err_out) {
    char shape[64];
    snprintf(shape, sizeof shape, "M=%d N=%d K=%d%s%s", M, N, K, flags & 1 ? " +c" : "",
             flags & 2 ? " f32" : "");
    const size_t osz = flags & 2 ? 4 : 2, na = (size_t)M * K, nb = (size_t)N * K, no = (size_t)M * N;
    const size_t off_a = 11, off_b = 2222, off_c = 333333;
    cur.a = dev_act(na, off_a);
    cur.b = dev_act(nb, off_b);
    cur_qa = fp8_matrix(M, K, fa, s, 0);
    cur_qb = fp8_matrix(N, K, fb, s, 0);
    gpu->fp8_quantize(&cur_qa, cur.a, 0);
    gpu->fp8_quantize(&cur_qb, cur.b, 0);
    gpu->free(cur.a), gpu->free(cur.b);
    cur.c = gpu->alloc(no * osz);
    cur.e = NULL;
    if (flags & 1) {
        if (flags & 2) {
            float *h = host_vals(off_c, no, 1.0f);
            cur.e = dev_f32_from(h, no);
            free(h);
        } else {
            cur.e = dev_act(no, off_c);
        }
    }
    cur.acc = flags;
    cur_fp8_flags = (flags & 2 ? SHLM_FP8_OUT_F32 : 0) | (fast_accum ? SHLM_FP8_FAST_ACCUM : 0);
    run_matmul_fp8();
    const unsigned ran = shlm_cuda_fp8_matmul_ran();
    int nwrong = fp8_no_reference(name);
    double err = NAN;
    if (!nwrong) {
        const int rows = M < CHECK_ROWS ? M : CHECK_ROWS;
        shlm_fp8_matrix ha = fp8_matrix(rows, K, fa, s, 1), hb = fp8_matrix(N, K, fb, s, 1);
        gpu->to_host(ha.codes, cur_qa.codes, (size_t)rows * K);
        gpu->to_host(ha.scale_inv, cur_qa.scale_inv, fp8_nscales(&ha) * sizeof(float));
        gpu->to_host(hb.codes, cur_qb.codes, nb);
        gpu->to_host(hb.scale_inv, cur_qb.scale_inv, fp8_nscales(&hb) * sizeof(float));
        float *ref = flags & 1 ? host_vals(off_c, (size_t)rows * N, 1.0f)
                               : xmalloc((size_t)rows * N * sizeof(float));
        cpu->matmul_fp8(ref, SHLM_FP8_OUT_F32, &ha, &hb, flags & 1 ? ref : NULL);
        float *got = flags & 2 ? down_f32(cur.c, (size_t)rows * N) : down_act(cur.c, (size_t)rows * N);
        err = rel_l2(got, ref, (size_t)rows * N);
        nwrong = wrong(err, flags & 2 ? 1e-3 : 1e-2, name);
        free(ref), free(got);
        fp8_free(&ha, 1), fp8_free(&hb, 1);
    }
    double us = time_us(run_matmul_fp8);
    char op[48];
    snprintf(op, sizeof op, "%s%s", name, ran == SHLM_FP8_RAN_FALLBACK ? " (fallback)" : "");
    row(op, shape, us, 2.0 * M * N * K, 0, nwrong);
    if (err_out) *err_out = err;
    fp8_free(&cur_qa, 0), fp8_free(&cur_qb, 0);
    gpu->free(cur.c), gpu->free(cur.e);
    return us;
}

/* bf16 forms one at a time, as the model runs them */
static void run_matmul_dgrad(void) {
    gpu->matmul_bwd(cur.d, NULL, cur.c, NULL, cur.b, cur.N, cur.C, cur.OC, SHLM_MM_SET_DINP);
}
static void run_matmul_wgrad(void) {
    gpu->matmul_bwd(NULL, cur.f0, cur.c, cur.a, NULL, cur.N, cur.C, cur.OC, SHLM_MM_SET_DWEIGHT);
}

/* the bf16 product of one form (0 fwd, 1 dgrad, 2 wgrad), timed only (bench_matmul and
 * bench_matmul_bwd check the same products) */
static void bench_bf16_form(const char *name, int form, int N, int C, int OC, int acc) {
    char shape[64];
    static const char *const mnk[3] = {"M=%d N=%d K=%d%s", "M=%d N=%d K=%d%s", "M=%d N=%d K=%d%s f32"};
    const int M = form == 2 ? OC : N, NN = form == 0 ? OC : C, K = form == 0 ? C : form == 1 ? OC : N;
    snprintf(shape, sizeof shape, mnk[form], M, NN, K, acc ? " +c" : "");
    cur.a = dev_act((size_t)N * C, 11);
    cur.b = dev_act((size_t)OC * C, 2222);
    cur.c = dev_act((size_t)N * OC, 44444);
    cur.e = acc ? dev_act((size_t)N * OC, 333333) : NULL;
    cur.d = form == 1 ? gpu->alloc((size_t)N * C * 2) : NULL;
    cur.f0 = form == 2 ? gpu->alloc((size_t)OC * C * sizeof(float)) : NULL;
    cur.N = N, cur.C = C, cur.OC = OC, cur.acc = acc;
    double us = time_us(form == 0 ? run_matmul_fwd : form == 1 ? run_matmul_dgrad : run_matmul_wgrad);
    row(name, shape, us, 2.0 * N * C * OC, 0, 0);
    gpu->free(cur.a), gpu->free(cur.b), gpu->free(cur.c), gpu->free(cur.e), gpu->free(cur.d);
    gpu->free(cur.f0);
    cur.d = NULL, cur.e = NULL, cur.f0 = NULL;
}

/* One linear layer y(N,OC) = x(N,C)·W(OC,C)ᵀ, its three products in bf16 and in both FP8
 * recipes (ops.h's forms: fwd q(x)·q(W)ᵀ, dgrad q(dy)·q(Wᵀ)ᵀ, wgrad q(dyᵀ)·q(xᵀ)ᵀ in
 * fp32; the gradient operand e5m2 tensorwise, e4m3 rowwise), and the forward once more
 * with fast accumulation (its rel_l2 against the cpu on a "#" line). */
static void bench_linear_fp8(const char *layer, int N, int C, int OC, int residual) {
    static const char *const form_name[3] = {"fwd", "dgrad", "wgrad"};
    for (int form = 0; form < 3; form++) {
        char name[48];
        const int acc = form == 0 && residual;
        snprintf(name, sizeof name, "bf16 %s %s", form_name[form], layer);
        bench_bf16_form(name, form, N, C, OC, acc);
        const int M = form == 2 ? OC : N, NN = form == 0 ? OC : C, K = form == 0 ? C : form == 1 ? OC : N;
        for (int rw = 0; rw < 2; rw++) {
            const shlm_fp8_scaling s = rw ? SHLM_FP8_ROWWISE : SHLM_FP8_TENSORWISE;
            const shlm_fp8_format g = rw || form == 0 ? SHLM_FP8_E4M3 : SHLM_FP8_E5M2;
            snprintf(name, sizeof name, "fp8-%s %s %s", rw ? "rw" : "tw", form_name[form], layer);
            double err = NAN, err_fa = NAN;
            bench_fp8_gemm(name, M, NN, K, g, SHLM_FP8_E4M3, s, (acc ? 1 : 0) | (form == 2 ? 2 : 0), 0,
                           &err);
            if (form == 0) {
                snprintf(name, sizeof name, "fp8-%s+fa %s %s", rw ? "rw" : "tw", form_name[form], layer);
                bench_fp8_gemm(name, M, NN, K, g, SHLM_FP8_E4M3, s, acc ? 1 : 0, 1, &err_fa);
                printf("# %s fp8-%s fwd: rel_l2 against the cpu %.3e fp32 accumulation, %.3e fast "
                       "accumulation\n", layer, rw ? "rw" : "tw", err, err_fa);
            }
        }
    }
}

static void bench_fp8(int N) {
    if (!gpu->fp8_check || !gpu->fp8_quantize || !gpu->fp8_quantize_both || !gpu->matmul_fp8 ||
        !gpu->fp8_param_amax || !gpu->fp8_param_scale || !gpu->fp8_param_cast || !gpu->fp8_transpose) {
        printf("# fp8: this build's cuda backend has no FP8 members\n");
        g_wrong_total++;
        return;
    }
    char why[256];
    if (gpu->fp8_check(why, sizeof why) != 0) {
        printf("# fp8: skipped: %s\n", why);
        return;
    }
    /* the quantize kernels on the operands of one block's products */
    bench_fp8_quantize("fp8_quantize x", N, D, SHLM_FP8_E4M3, SHLM_FP8_TENSORWISE, 0, 77);
    bench_fp8_quantize("fp8_quantize x", N, D, SHLM_FP8_E4M3, SHLM_FP8_ROWWISE, 0, 77);
    bench_fp8_quantize("fp8_quantize xT", D, N, SHLM_FP8_E4M3, SHLM_FP8_TENSORWISE, 1, 77);
    bench_fp8_quantize("fp8_quantize xT", D, N, SHLM_FP8_E4M3, SHLM_FP8_ROWWISE, 1, 77);
    bench_fp8_quantize("fp8_quantize WT", D, 3 * D, SHLM_FP8_E4M3, SHLM_FP8_TENSORWISE, 1, 2222);
    bench_fp8_quantize("fp8_quantize WT", D, 3 * D, SHLM_FP8_E4M3, SHLM_FP8_ROWWISE, 1, 2222);
    bench_fp8_quantize("fp8_quantize dyT", 2 * FF, N, SHLM_FP8_E5M2, SHLM_FP8_TENSORWISE, 1, 999);
    bench_fp8_quantize("fp8_quantize dyT", 2 * FF, N, SHLM_FP8_E4M3, SHLM_FP8_ROWWISE, 1, 999);
    bench_fp8_quantize_both("fp8_quantize_both x", N, D, SHLM_FP8_E4M3, SHLM_FP8_TENSORWISE, 77);
    bench_fp8_quantize_both("fp8_quantize_both dy", N, 2 * FF, SHLM_FP8_E5M2, SHLM_FP8_TENSORWISE, 999);
    bench_fp8_quantize_both("fp8_quantize_both dy", N, 2 * FF, SHLM_FP8_E4M3, SHLM_FP8_ROWWISE, 999);
    /* FP8 weights from the fp32 parameters (down's W), and the transposes of the codes
     * (down's W, 4096 x 11008, and qkv's, 12288 x 4096) */
    if (!fp8_no_reference("fp8_param_cast")) {
        bench_fp8_param(D, FF, 4242);
        bench_fp8_transpose(D, FF, 31);
        bench_fp8_transpose(3 * D, D, 32);
    } else {
        g_wrong_total++;
    }
    /* the square ceiling, then every linear of a block */
    bench_fp8_gemm("fp8-tw 8192^3", 8192, 8192, 8192, SHLM_FP8_E4M3, SHLM_FP8_E4M3,
                   SHLM_FP8_TENSORWISE, 0, 0, NULL);
    bench_fp8_gemm("fp8-rw 8192^3", 8192, 8192, 8192, SHLM_FP8_E4M3, SHLM_FP8_E4M3,
                   SHLM_FP8_ROWWISE, 0, 0, NULL);
    bench_linear_fp8("qkv", N, D, 3 * D, 0);
    bench_linear_fp8("o", N, D, D, 1);
    bench_linear_fp8("gate_up", N, D, 2 * FF, 0);
    bench_linear_fp8("down", N, FF, D, 1);
    /* odd shapes take the declared fallback: checked, timed once as a reference point */
    bench_fp8_gemm("fp8-tw odd", 1000, 1000, 1000, SHLM_FP8_E4M3, SHLM_FP8_E4M3,
                   SHLM_FP8_TENSORWISE, 1, 0, NULL);
    bench_fp8_gemm("fp8-rw odd", 1000, 1000, 1000, SHLM_FP8_E5M2, SHLM_FP8_E4M3,
                   SHLM_FP8_ROWWISE, 2, 0, NULL);
}

/* ------------------------------------------------------------------ ceilings */
static void ceilings(void) {
    /* 8192³ bf16 GEMM through the backend (cuBLASLt, fp32 accumulation) */
    const int M = 8192;
    cur.a = dev_act((size_t)M * M, 1);
    cur.b = dev_act((size_t)M * M, 5000);
    cur.c = gpu->alloc((size_t)M * M * 2);
    cur.N = cur.C = cur.OC = M, cur.acc = 0;
    run_matmul_fwd();
    float *x = host_vals(1, (size_t)4 * M, 1.0f), *w = host_vals(5000, (size_t)M * M, 1.0f);
    float *ref = xmalloc((size_t)4 * M * sizeof(float));
    cpu->matmul_fwd(ref, x, w, 4, M, M, NULL);
    float *got = down_act(cur.c, (size_t)4 * M);
    int w1 = wrong(rel_l2(got, ref, (size_t)4 * M), 1e-2, "matmul 8192^3");
    double us = time_us(run_matmul_fwd);
    g_ceil_tflops = 2.0 * M * M * (double)M / us * 1e-6;
    free(x), free(w), free(ref), free(got);
    gpu->free(cur.a), gpu->free(cur.b), gpu->free(cur.c);

    /* 1 GiB device-to-device copy, bytes read + written */
    const size_t n = (size_t)1 << 29; /* bf16 elements */
    cur.a = dev_act(n, 77777);
    cur.b = gpu->alloc(n * 2);
    cur.n = n * 2;
    run_copy();
    float *cp = down_act(cur.b, (size_t)1 << 20), *cr = host_vals(77777, (size_t)1 << 20, 1.0f);
    int w2 = memcmp(cp, cr, ((size_t)1 << 20) * sizeof(float)) != 0;
    free(cp), free(cr);
    double us2 = time_us(run_copy);
    g_ceil_gbs = 2.0 * (double)cur.n / us2 * 1e-3;
    gpu->free(cur.a), gpu->free(cur.b);
    row("ceiling: matmul bf16", "8192x8192x8192", us, 2.0 * M * M * (double)M, 0, w1);
    row("ceiling: copy d2d", "1 GiB", us2, 0, 2.0 * (double)n * 2, w2);
}

/* ------------------------------------------------------------------ main */
int main(int argc, char **argv) {
    int mb = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) g_iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) g_only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--mb N] [--iters N] [--only OP]\n", argv[0]);
            return 2;
        }
    }
    if (mb < 1 || g_iters < 1) {
        fprintf(stderr, "%s: --mb and --iters must be >= 1\n", argv[0]);
        return 2;
    }
    if (!gpu->available()) {
        printf("# bench_kernels: no CUDA device visible: skipped\n");
        return 77;
    }
    const int N = SEQ * mb;
    const int chunk = (1 << 26) / VOCAB; /* src/model/llama/llama.c's logits chunk */
    struct cudaDeviceProp prop;
    int dev = 0;
    cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_ok(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    pool_init();
    const shlm_rope_params rope_params = {.type = SHLM_ROPE_DEFAULT, .theta = 10000.0};
    char why[256];
    if (shlm_rope_init(&g_rope, HD, &rope_params, why, sizeof why) != 0) {
        fprintf(stderr, "%s: %s\n", argv[0], why);
        return 2;
    }
    printf("# bench_kernels: cuda backend on %s (%d SMs), Llama-2-7B shapes, mb=%d (N=%d tokens), "
           "median of %d runs\n", prop.name, prop.multiProcessorCount, mb, N, g_iters);
    printf("# %%ceiling: TFLOP/s over the bf16 matmul ceiling, or GB/s over the copy ceiling, "
           "both measured below\n");
    printf("#  %-22s %-30s %10s %9s %9s %9s %7s\n", "op", "shape", "time(us)", "TFLOP/s", "GB/s",
           "%ceiling", "#wrong");
    ceilings();

    if (want("embedding")) bench_embedding(N, D, VOCAB);
    if (want("rmsnorm")) bench_rmsnorm(N, D);
    if (want("matmul_fwd qkv")) bench_matmul("matmul_fwd qkv", N, D, 3 * D, 0);
    if (want("rope")) bench_rope(N, SEQ, 0);
    if (want("attention")) bench_attention(mb, SEQ, 0);
    if (want("attention docs")) bench_attention(mb, SEQ, 512);
    if (want("attention_decode")) {
        bench_decode(1, SEQ);
        bench_decode(16, SEQ);
    }
    if (want("matmul_fwd o")) bench_matmul("matmul_fwd o", N, D, D, 1);
    if (want("matmul_fwd gate_up")) bench_matmul("matmul_fwd gate_up", N, D, 2 * FF, 0);
    if (want("swiglu")) bench_swiglu(N, FF);
    if (want("matmul_fwd down")) bench_matmul("matmul_fwd down", N, FF, D, 1);
    if (want("matmul_fwd lm_head")) bench_matmul("matmul_fwd lm_head", chunk, D, VOCAB, 0);
    if (want("xent")) bench_xent(chunk, VOCAB);
    if (want("matmul_bwd lm_head")) bench_matmul_bwd("matmul_bwd lm_head", chunk, D, VOCAB);
    if (want("matmul_bwd down")) bench_matmul_bwd("matmul_bwd down", N, FF, D);
    if (want("matmul_bwd gate_up")) bench_matmul_bwd("matmul_bwd gate_up", N, D, 2 * FF);
    if (want("matmul_bwd o")) bench_matmul_bwd("matmul_bwd o", N, D, D);
    if (want("rope")) bench_rope(N, SEQ, 1);
    if (want("matmul_bwd qkv")) bench_matmul_bwd("matmul_bwd qkv", N, D, 3 * D);
    if (want("convert")) bench_convert((size_t)N * D);
    if (want("fp8") || want("bf16")) bench_fp8(N);
    if (want("optimizer")) /* one block */
        bench_optimizer((size_t)4 * D * D + (size_t)3 * D * FF + 2 * D);

    printf("# ceilings: bf16 matmul %.1f TFLOP/s, device copy %.0f GB/s\n", g_ceil_tflops,
           g_ceil_gbs);
    printf("# %d wrong\n", g_wrong_total);
    free(g_pool);
    free(g_pool_bf);
    return g_wrong_total ? 1 : 0;
}
