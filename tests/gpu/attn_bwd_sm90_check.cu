/* GPU check of the Hopper wgmma kernels of the attention backward
 * (kernels/cuda/attention_bwd_sm90.cu: the dK/dV(+dS) pass and the dQ pass) inside the
 * whole backward (shlm_cuda_attention_bwd_variant: D, dK/dV, dQ; either dQ kernel reads
 * the dS fragments either dK/dV kernel wrote), against the backward on attention.cu's
 * mma.sync kernels and against a float64 CPU reference, with timings.
 *
 * Build: `make check` in a CUDA build directory builds it (tests/gpu/attn_bwd_sm90_check),
 * or with nvcc alone (tests/gpu/attn_sm90_shim.cu stands in for the backend's stream,
 * scratch and fatal path), from the repository root:
 *   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -o attn_bwd_sm90_check \
 *       tests/gpu/attn_bwd_sm90_check.cu tests/gpu/attn_sm90_shim.cu kernels/cuda/attention.cu \
 *       kernels/cuda/attention_sm90.cu kernels/cuda/attention_bwd_sm90.cu kernels/cuda/rope.cu
 * Run (on the H200):
 *   attn_bwd_sm90_check              # every case, both pipelines, then timings
 *   attn_bwd_sm90_check --no-time    # correctness only
 *   attn_bwd_sm90_check --small      # the float64 cases only (for compute-sanitizer)
 *   attn_bwd_sm90_check --time-only  # timings only
 *   attn_bwd_sm90_check --no-ws      # (with any of the above) without paths 10-16
 *                                    # (path 1 still runs the default dK/dV, variant 6)
 * Exit status 0: all passed; 1: a check failed; 77: no compute capability 9.0 GPU.
 *
 * Inputs: q, k ~ N(0, 1.5²) (peaked softmax rows), v, dout ~ N(0, 1), bf16; out and lse
 * from shlm_cuda_attention_fwd. Per case and per path (the kernels chosen through
 * shlm_cuda_attention_bwd_variant: path 0 attention.cu's mma.sync dK/dV and dQ, path 1
 * the wgmma defaults, paths 2-16 the wgmma variants and mixes, see `paths` below; 10-13
 * are the warp-specialised TMA dK/dV kernel attn_bwd_dkv_ws; path 1 runs its variant 6 since it became the default;
 * 14-16 the default dK/dV with the warp-specialised dQ attn_bwd_dq_ws, dQ variants 3-5), with
 * dqkv poisoned with NaN first:
 *   NaN/unwritten: none of dq, dk, dv may be NaN;
 *   vs float64 (small cases: naive causal attention forward and backward on the host, in
 *     double, from the same bf16 inputs): relative L2 error of dq, dk, dv each < 1.5e-2
 *     (bf16 inputs of every product: P, dS and the outputs are rounded to bf16; the
 *     mma.sync kernel is held to the same bound);
 *   wgmma vs mma.sync: relative L2 < 1e-2 and max |d| / max |ref| < 2e-2 for dq, dk, dv;
 *   determinism: a second run is bitwise equal; paths 1-16 are bitwise equal (the same
 *     products in the same order);
 *   (reported, not required: whether a path is bitwise equal to path 0).
 * With RoPE (rope_theta = 10000: dq, dk w.r.t. the pre-RoPE q, k; the wgmma kernels
 * rotate their fp32 accumulators before the one rounding to bf16, the mma.sync path runs
 * rope.cu's inverse kernel on its bf16 output, rounding twice), every path again:
 *   vs the host rotation (in double) of path 0's unrotated result: relative L2 < 1e-2 and
 *     max |d| / max |ref| < 2e-2 for dq, dk, dv (dv is not rotated);
 *   vs float64 rotated (small cases): < 1.5e-2;
 *   paths 1-9 vs path 0 with RoPE (mma.sync, then the rope kernel): relative L2 < 5e-3 and
 *     max |d| / max |ref| < 2e-2 for dq, dk (the two roundings differ by at most about
 *     one bf16 ulp of an element, ~2^-8 of it; about 2e-3 expected in L2), dv bitwise
 *     equal to path 0's dv;
 *   dv of every path bitwise equal to its dv without RoPE; paths 1-8 and 10-16 (both parts
 *     fused) bitwise equal to each other; path 9 (wgmma dK/dV, mma.sync dQ): dk bitwise equal to
 *     path 1's, dq to path 0's (the same rope kernel on the same dq);
 *   determinism: path 1 with RoPE twice, bitwise equal.
 * On a failure the worst error is located (tensor, b, t, head, dim) and the max |diff| is
 * printed by key block (t % 128 / 16: warpgroup 0 is 0-3) × dim block (dim / 16).
 * Timings: the whole backward (D + dK/dV + dQ), cudaEvent over 10 launches after 3
 * warm-up ones; TFLOP/s with 2.5 × the causal forward's 4·B·nh·T²·hd/2 flops; the wgmma
 * defaults with RoPE fused, and without it followed by the separate rope inverse kernel
 * (what the model ran before); then the wgmma dK/dV and dQ passes alone (4/5 and 1/5 of
 * those flops). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "tests/gpu/attn_check.h"

static cudaStream_t stream(void) { return (cudaStream_t)shlm_cuda_stream_handle(); }

/* ------------------------------------------------------------------ comparisons */

/* part 0 dq, 1 dk, 2 dv of dqkv (B·T, (nh + 2nkv)·hd): got against ref (either layout,
 * float), prints, returns whether it passed */
static bool check_part(const char *what, int part, const __nv_bfloat16 *got, const float *ref,
                       const Case &c, double tol_l2, double tol_max) {
    const size_t C3 = (size_t)(c.nh + 2 * c.nkv) * c.hd;
    const int c0 = part == 0 ? 0 : part == 1 ? c.nh * c.hd : (c.nh + c.nkv) * c.hd;
    const int nc = part == 0 ? c.nh * c.hd : c.nkv * c.hd;
    double maxref = 0, maxdiff = 0, se = 0, sr = 0;
    size_t nbad = 0, wrow = 0;
    int wcol = 0;
    static float blk[8][8];
    memset(blk, 0, sizeof blk);
    for (size_t row = 0; row < (size_t)c.B * c.T; row++)
        for (int j = 0; j < nc; j++) {
            const size_t i = row * C3 + c0 + j;
            const double r = ref[i], g = bf(got[i]);
            if (fabs(r) > maxref) maxref = fabs(r);
            if (isnan(g)) {
                nbad++;
                continue;
            }
            const double e = fabs(g - r);
            if (e > maxdiff) maxdiff = e, wrow = row, wcol = j;
            se += e * e, sr += r * r;
            float &b = blk[(row % c.T % 128) / 16][(j % c.hd % 128) / 16];
            if (e > b) b = (float)e;
        }
    const double rel = maxref > 0 ? maxdiff / maxref : maxdiff, l2 = sr > 0 ? sqrt(se / sr) : 0;
    const bool ok = nbad == 0 && l2 < tol_l2 && (tol_max <= 0 || rel < tol_max);
    printf("    %-26s relL2 %.3e (tol %.1e)  max|d|/max|ref| %.3e", what, l2, tol_l2, rel);
    if (tol_max > 0) printf(" (tol %.0e)", tol_max);
    printf("  NaN %zu %s\n", nbad, ok ? "ok" : "FAIL");
    if (!ok) {
        const size_t i = wrow * C3 + c0 + wcol;
        printf("      worst: b %zu t %zu head %d dim %d: got %g ref %g\n", wrow / c.T, wrow % c.T,
               wcol / c.hd, wcol % c.hd, bf(got[i]), ref[i]);
        print_block_table(blk, c.hd);
        n_failed++;
    }
    return ok;
}

/* float64 causal attention forward and backward on the host: dqkv (B·T, C3) */
static void cpu_backward(float *dqkv, const __nv_bfloat16 *qkv, const __nv_bfloat16 *dout,
                         const Case &c) {
    const int hd = c.hd, T = c.T;
    const size_t C3 = (size_t)(c.nh + 2 * c.nkv) * hd, CO = (size_t)c.nh * hd;
    const double scale = 1.0 / sqrt((double)hd);
    const size_t n = (size_t)c.B * T * C3;
    double *acc = (double *)calloc(n, sizeof(double));
    double *p = (double *)malloc(sizeof(double) * T), *o = (double *)malloc(sizeof(double) * hd);
    double *dp = (double *)malloc(sizeof(double) * T);
    auto X = [&](int b, int t, size_t col) { return (double)bf(qkv[((size_t)b * T + t) * C3 + col]); };
    for (int b = 0; b < c.B; b++)
        for (int h = 0; h < c.nh; h++) {
            const int kvh = h / (c.nh / c.nkv);
            const size_t qc = (size_t)h * hd, kc = (size_t)(c.nh + kvh) * hd,
                         vc = (size_t)(c.nh + c.nkv + kvh) * hd;
            for (int i = 0; i < T; i++) {
                double mx = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += X(b, i, qc + d) * X(b, j, kc + d);
                    p[j] = s * scale;
                    if (p[j] > mx) mx = p[j];
                }
                double sum = 0;
                for (int j = 0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int j = 0; j <= i; j++) {
                    p[j] /= sum;
                    for (int d = 0; d < hd; d++) o[d] += p[j] * X(b, j, vc + d);
                }
                const __nv_bfloat16 *go = dout + ((size_t)b * T + i) * CO + qc;
                double D = 0;
                for (int d = 0; d < hd; d++) D += (double)bf(go[d]) * o[d];
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += (double)bf(go[d]) * X(b, j, vc + d);
                    dp[j] = p[j] * (s - D) * scale; /* dS */
                }
                double *dq = acc + ((size_t)b * T + i) * C3 + qc;
                for (int j = 0; j <= i; j++) {
                    double *dk = acc + ((size_t)b * T + j) * C3 + kc;
                    double *dv = acc + ((size_t)b * T + j) * C3 + vc;
                    for (int d = 0; d < hd; d++) {
                        dq[d] += dp[j] * X(b, j, kc + d);
                        dk[d] += dp[j] * X(b, i, qc + d);
                        dv[d] += p[j] * (double)bf(go[d]);
                    }
                }
            }
        }
    for (size_t i = 0; i < n; i++) dqkv[i] = (float)acc[i];
    free(acc), free(p), free(o), free(dp);
}

/* The inverse RoPE rotation (ops.h rope, inverse = 1) of the q and k heads of dqkv
 * (B·T rows), in double on the host: angle t·theta^(-2f/hd) for row b·T + t */
static void rope_inv_host(float *x, const Case &c, double theta) {
    const size_t C3 = (size_t)(c.nh + 2 * c.nkv) * c.hd;
    const int half = c.hd / 2;
    for (size_t row = 0; row < (size_t)c.B * c.T; row++) {
        const double pos = (double)(row % c.T);
        for (int f = 0; f < half; f++) {
            const double ang = pos * pow(theta, -2.0 * f / c.hd);
            const double cs = cos(ang), sn = sin(ang);
            for (int h = 0; h < c.nh + c.nkv; h++) {
                float *lo = x + row * C3 + (size_t)h * c.hd, *hi = lo + half;
                const double a = lo[f], b = hi[f];
                lo[f] = (float)(a * cs + b * sn);
                hi[f] = (float)(b * cs - a * sn);
            }
        }
    }
}

/* part 0 dq, 1 dk, 2 dv of two bf16 dqkv buffers bitwise equal */
static bool same_part(const __nv_bfloat16 *a, const __nv_bfloat16 *b, int part, const Case &c) {
    const size_t C3 = (size_t)(c.nh + 2 * c.nkv) * c.hd;
    const int c0 = part == 0 ? 0 : part == 1 ? c.nh * c.hd : (c.nh + c.nkv) * c.hd;
    const int nc = part == 0 ? c.nh * c.hd : c.nkv * c.hd;
    for (size_t row = 0; row < (size_t)c.B * c.T; row++)
        if (memcmp(a + row * C3 + c0, b + row * C3 + c0, (size_t)nc * 2) != 0) return false;
    return true;
}

static void report_same(const char *what, bool ok) {
    printf("    %-40s %s\n", what, ok ? "ok" : "FAIL");
    if (!ok) n_failed++;
}

static const double ROPE_THETA = 10000.0;

/* ------------------------------------------------------------------ one case */

/* (kv, dq) arguments of shlm_cuda_attention_bwd_variant: 0 mma.sync, 1 the wgmma
 * default, 2 + v wgmma variant v (dK/dV: 0 two warpgroups overlapped, 1 two serial, 2 one
 * warpgroup per block, 3 three Q/dO buffers, 4 ping-pong issue, 5-8 attn_bwd_dkv_ws, the
 * TMA producer warp: 5 two slots FA3's order (XO 2), 6 three slots XO 2, 7 two slots the
 * plain order (XO 0), 8 two slots XO 1; dQ: 0 two warpgroups, 1 one, 2 two with
 * three stages, 3-5 attn_bwd_dq_ws, the producer warps (TMA K, bulk-copy dS): 3 K ring 3
 * slots, dS ring 4, fragments of the next step loaded under the current wgmma (OV); 4 the
 * same rings without OV; 5 K ring 3, dS ring 2, OV; attention_bwd_sm90.cu's DKV_DEFAULT
 * and DQ_DEFAULT). hd: 0 every head_dim,
 * else the only one the path runs at (the others are skipped, not failed). */
#define NPATH 17
static const struct {
    int kv, dq, hd;
    const char *name;
} paths[NPATH] = {
    {0, 0, 0, "mma.sync dKdV + dQ"},     {1, 1, 0, "wgmma defaults"},
    {2, 2, 0, "dKdV 2wg, dQ 2wg"},       {3, 2, 0, "dKdV 2wg serial, dQ 2wg"},
    {4, 3, 0, "dKdV 1wg, dQ 1wg"},
    {5, 2, 0, "dKdV 2wg 3buf, dQ 2wg"},  {6, 2, 0, "dKdV 2wg pp, dQ 2wg"},
    {2, 4, 0, "dKdV 2wg, dQ 2wg 3st"},   {6, 4, 0, "dKdV 2wg pp, dQ 2wg 3st"},
    {2, 0, 0, "dKdV 2wg, dQ mma.sync"},
    {7, 2, 0, "dKdV ws XO2 2slot, dQ 2wg"}, {8, 2, 0, "dKdV ws XO2 3slot, dQ 2wg"},
    {9, 2, 0, "dKdV ws XO0 2slot, dQ 2wg"}, {10, 2, 0, "dKdV ws XO1 2slot, dQ 2wg"},
    {1, 5, 0, "dKdV default, dQ ws K3 dS4 ov"}, {1, 6, 0, "dKdV default, dQ ws K3 dS4"},
    {1, 7, 0, "dKdV default, dQ ws K3 dS2 ov"},
};

/* --no-ws: leave out the warp-specialised dK/dV variants (paths 10-13, variants 5-8) and
 * dQ variants (paths 14-16, variants 3-5), so that a hang there cannot cost the other
 * checks their run (path 1 runs the default dK/dV, warp-specialised since session 4) */
static bool skip_ws = false;
static bool is_ws_path(int k) { return paths[k].kv >= 7 || paths[k].dq >= 5; }
static bool path_runs(int k, int hd) {
    return !(paths[k].hd && paths[k].hd != hd) && !(skip_ws && is_ws_path(k));
}

static void run_case(const Case &c, bool check, bool timing) {
    printf("== B=%d T=%d nh=%d nkv=%d hd=%d\n", c.B, c.T, c.nh, c.nkv, c.hd);
    const size_t C3 = (size_t)(c.nh + 2 * c.nkv) * c.hd;
    const size_t n_qkv = (size_t)c.B * c.T * C3, n_out = (size_t)c.B * c.T * c.nh * c.hd;
    const size_t n_lse = (size_t)c.B * c.nh * c.T;
    __nv_bfloat16 *h_qkv = (__nv_bfloat16 *)malloc(n_qkv * 2), *h_do = (__nv_bfloat16 *)malloc(n_out * 2);
    for (size_t i = 0; i < n_qkv; i++) {
        const bool is_v = (i % C3) >= (size_t)(c.nh + c.nkv) * c.hd;
        h_qkv[i] = __float2bfloat16(is_v ? gauss() : 1.5f * gauss());
    }
    for (size_t i = 0; i < n_out; i++) h_do[i] = __float2bfloat16(gauss());
    void *d_qkv, *d_do, *d_out, *d_g[NPATH], *d_g2;
    float *d_lse;
    CK(cudaMalloc(&d_qkv, n_qkv * 2));
    CK(cudaMalloc(&d_do, n_out * 2));
    CK(cudaMalloc(&d_out, n_out * 2));
    CK(cudaMalloc(&d_lse, n_lse * 4));
    for (int k = 0; k < NPATH; k++) CK(cudaMalloc(&d_g[k], n_qkv * 2));
    CK(cudaMalloc(&d_g2, n_qkv * 2));
    CK(cudaMemcpy(d_qkv, h_qkv, n_qkv * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_do, h_do, n_out * 2, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize()); /* the kernels run on the backend's non-blocking stream */
    shlm_cuda_attention_fwd(d_out, d_lse, d_qkv, c.B, c.T, c.nh, c.nkv, c.hd);
    CK(cudaStreamSynchronize(stream()));
    CK(cudaGetLastError());

    /* One backward (kv, dq as in paths[]) into dst, first filled with NaN (bf16 0xffff),
     * waited for. False, with the FAIL printed and counted, when a wgmma kernel declined
     * (rc 1) or CUDA failed; a CUDA error is sticky and poisons every later call, so the
     * check stops there. */
    auto run_path = [&](void *dst, int kv, int dq, float theta) -> bool {
        CK(cudaMemsetAsync(dst, 0xff, n_qkv * 2, stream()));
        const int rc = shlm_cuda_attention_bwd_variant(dst, d_do, d_qkv, d_out, d_lse, c.B, c.T,
                                                       c.nh, c.nkv, c.hd, kv, dq, theta);
        cudaError_t err = cudaStreamSynchronize(stream());
        if (err == cudaSuccess) err = cudaGetLastError();
        if (rc == 0 && err == cudaSuccess) return true;
        printf("    FAIL: rc %d (1 = a wgmma kernel declined), CUDA: %s\n", rc,
               cudaGetErrorString(err));
        n_failed++;
        if (err != cudaSuccess) exit(1);
        return false;
    };

    if (check) {
        __nv_bfloat16 *h_g[NPATH], *h_g2 = (__nv_bfloat16 *)malloc(n_qkv * 2);
        float *f_old = (float *)malloc(n_qkv * 4);
        float *f_cpu = NULL;
        if ((double)c.B * c.nh * c.T * c.T * c.hd < 1e8) {
            f_cpu = (float *)malloc(n_qkv * 4);
            cpu_backward(f_cpu, h_qkv, h_do, c);
        }
        bool ran[NPATH] = {};
        for (int k = 0; k < NPATH; k++) {
            h_g[k] = (__nv_bfloat16 *)malloc(n_qkv * 2);
            if (!path_runs(k, c.hd)) {
                printf("  path %d: %s: skipped\n", k, paths[k].name);
                continue;
            }
            printf("  path %d: %s\n", k, paths[k].name);
            if (!run_path(d_g[k], paths[k].kv, paths[k].dq, 0.0f)) continue;
            CK(cudaMemcpy(h_g[k], d_g[k], n_qkv * 2, cudaMemcpyDeviceToHost));
            ran[k] = true;
            if (k == 0)
                for (size_t i = 0; i < n_qkv; i++) f_old[i] = bf(h_g[0][i]);
            const char *pn[3] = {"dq", "dk", "dv"};
            char what[64];
            for (int part = 0; part < 3; part++) {
                if (f_cpu) {
                    snprintf(what, sizeof what, "%s vs float64", pn[part]);
                    check_part(what, part, h_g[k], f_cpu, c, 1.5e-2, 0);
                }
                if (k > 0) {
                    snprintf(what, sizeof what, "%s vs mma.sync", pn[part]);
                    check_part(what, part, h_g[k], f_old, c, 1e-2, 2e-2);
                }
            }
            if (run_path(d_g2, paths[k].kv, paths[k].dq, 0.0f)) {
                CK(cudaMemcpy(h_g2, d_g2, n_qkv * 2, cudaMemcpyDeviceToHost));
                const bool same = memcmp(h_g[k], h_g2, n_qkv * 2) == 0;
                printf("    %-26s %s\n", "second run bitwise equal", same ? "ok" : "FAIL");
                if (!same) n_failed++;
            }
            if (k > 0)
                printf("    %-26s %s\n", "bitwise equal to path 0",
                       memcmp(h_g[k], h_g[0], n_qkv * 2) == 0 ? "yes" : "no (not required)");
        }
        for (int k = 2; k < NPATH; k++)
            if (ran[1] && ran[k] && memcmp(h_g[1], h_g[k], n_qkv * 2) != 0) {
                printf("    path %d differs bitwise from path 1: FAIL\n", k);
                n_failed++;
            }

        /* RoPE: the same paths with rope_theta, against the host rotation of path 0's
         * unrotated result and against path 0 with RoPE (mma.sync, then the rope kernel) */
        const float theta = (float)ROPE_THETA;
        float *f_rot = (float *)malloc(n_qkv * 4);
        memcpy(f_rot, f_old, n_qkv * 4);
        rope_inv_host(f_rot, c, ROPE_THETA);
        if (f_cpu) rope_inv_host(f_cpu, c, ROPE_THETA);
        float *f_r0 = (float *)malloc(n_qkv * 4);
        __nv_bfloat16 *h_r[NPATH];
        for (int k = 0; k < NPATH; k++) {
            h_r[k] = (__nv_bfloat16 *)malloc(n_qkv * 2);
            memset(h_r[k], 0xff, n_qkv * 2);
            if (!ran[k]) continue;
            printf("  path %d with RoPE: %s\n", k, paths[k].name);
            if (!run_path(d_g2, paths[k].kv, paths[k].dq, theta)) continue; /* h_r[k] stays NaN */
            CK(cudaMemcpy(h_r[k], d_g2, n_qkv * 2, cudaMemcpyDeviceToHost));
            if (k == 0)
                for (size_t i = 0; i < n_qkv; i++) f_r0[i] = bf(h_r[0][i]);
            const char *pn[3] = {"dq", "dk", "dv"};
            char what[64];
            for (int part = 0; part < 3; part++) {
                snprintf(what, sizeof what, "%s vs host-rotated", pn[part]);
                check_part(what, part, h_r[k], f_rot, c, 1e-2, 2e-2);
                if (f_cpu) {
                    snprintf(what, sizeof what, "%s vs float64 rotated", pn[part]);
                    check_part(what, part, h_r[k], f_cpu, c, 1.5e-2, 0);
                }
                if (k > 0 && part < 2) {
                    snprintf(what, sizeof what, "%s vs mma.sync+rope", pn[part]);
                    check_part(what, part, h_r[k], f_r0, c, 5e-3, 2e-2);
                }
            }
            report_same("dv bitwise equal to no-RoPE dv", same_part(h_r[k], h_g[k], 2, c));
            if (k > 0) report_same("dv bitwise equal to path 0's", same_part(h_r[k], h_r[0], 2, c));
            if (k == 1) { /* determinism of the fused path */
                if (run_path(d_g2, 1, 1, theta)) {
                    CK(cudaMemcpy(h_g2, d_g2, n_qkv * 2, cudaMemcpyDeviceToHost));
                    report_same("second run bitwise equal", memcmp(h_g2, h_r[1], n_qkv * 2) == 0);
                }
                printf("    %-40s %s\n", "dq, dk bitwise equal to path 0's",
                       memcmp(h_r[1], h_r[0], n_qkv * 2) == 0 ? "yes" : "no (as expected: one rounding, not two)");
            }
        }
        /* every fused path but 9, whose dq is mma.sync's then the rope kernel (checked below) */
        for (int k = 2; k < NPATH; k++)
            if (k != 9 && ran[1] && ran[k] && memcmp(h_r[1], h_r[k], n_qkv * 2) != 0) {
                printf("    RoPE: path %d differs bitwise from path 1: FAIL\n", k);
                n_failed++;
            }
        report_same("RoPE: path 9 dk bitwise equal to path 1's", same_part(h_r[9], h_r[1], 1, c));
        report_same("RoPE: path 9 dq bitwise equal to path 0's", same_part(h_r[9], h_r[0], 0, c));
        for (int k = 0; k < NPATH; k++) free(h_r[k]);
        free(f_rot), free(f_r0);

        for (int k = 0; k < NPATH; k++) free(h_g[k]);
        free(h_g2), free(f_old), free(f_cpu);
    }

    if (timing) {
        const double flops = 2.5 * 4.0 * c.B * c.nh * (double)c.T * c.T * c.hd / 2;
        for (int k = 0; k < NPATH; k++) {
            if (!path_runs(k, c.hd)) continue;
            auto launch = [&]() {
                shlm_cuda_attention_bwd_variant(d_g[k], d_do, d_qkv, d_out, d_lse, c.B, c.T, c.nh,
                                                c.nkv, c.hd, paths[k].kv, paths[k].dq, 0.0f);
            };
            const double us = mean_launch_us(stream(), 3, 10, launch);
            printf("  time backward, path %d %-24s %8.1f us  %6.1f TFLOP/s\n", k, paths[k].name, us,
                   flops / (us * 1e-6) / 1e12);
        }
        /* RoPE on the wgmma defaults: fused into the epilogues, against the backward then
         * the separate inverse rope kernel over dqkv (what the model ran before) */
        for (int fused = 1; fused >= 0; fused--) {
            const float theta = (float)ROPE_THETA;
            const int C3i = (c.nh + 2 * c.nkv) * c.hd;
            auto launch = [&]() {
                shlm_cuda_attention_bwd_variant(d_g[1], d_do, d_qkv, d_out, d_lse, c.B, c.T, c.nh,
                                                c.nkv, c.hd, 1, 1, fused ? theta : 0.0f);
                if (!fused)
                    shlm_cuda_rope(d_g[1], c.B * c.T, c.T, C3i, c.nh + c.nkv, c.hd, theta, 1);
            };
            const double us = mean_launch_us(stream(), 3, 10, launch);
            printf("  time backward + RoPE, wgmma defaults, %-14s %8.1f us\n",
                   fused ? "fused" : "then rope", us);
        }
        /* the wgmma passes alone (D left zero: the timing does not depend on it) */
        const int nq64 = (c.T + 63) / 64, m = nq64 >> 1;
        const size_t ds_head = (nq64 & 1) ? (size_t)(m + 1) * (m + 1) : (size_t)m * (m + 1);
        void *d_ds;
        float *d_D;
        CK(cudaMalloc(&d_ds, (size_t)c.B * c.nh * ds_head * 8192 * 2));
        CK(cudaMalloc(&d_D, n_lse * 4));
        CK(cudaMemset(d_D, 0, n_lse * 4));
        const float scale = (float)(1.0 / sqrt((double)c.hd)), sl2 = scale * 1.4426950408889634f;
        const double fkv = 0.8 * flops, fdq = 0.2 * flops; /* 4 and 1 of the 5 products */
        /* dK/dV variants 0, 3, 4 (cp.async), 5-8 (TMA, warp-specialised); dQ variants 0, 2
         * (cp.async), 3-5 (TMA and bulk copies, warp-specialised) */
        static const struct {
            bool kv;
            int v;
        } alone[] = {{true, 0}, {true, 3}, {true, 4}, {true, 5}, {true, 6},
                     {true, 7}, {true, 8}, {false, 0}, {false, 2}, {false, 3},
                     {false, 4}, {false, 5}};
        for (const auto &a : alone) {
            const int v = a.v;
            if (skip_ws && (a.kv ? v >= 5 : v >= 3)) continue;
            auto launch = [&]() -> int {
                if (a.kv)
                    return shlm_cuda_attention_bwd_dkv_sm90_variant(
                        d_g[1], d_ds, ds_head, d_do, d_qkv, d_lse, d_D, 0, c.B, c.T, c.nh, c.nkv,
                        c.hd, scale, sl2, v, NULL);
                return shlm_cuda_attention_bwd_dq_sm90_variant(d_g[1], d_ds, ds_head, d_qkv, 0, c.B,
                                                               c.T, c.nh, c.nkv, c.hd, v, NULL);
            };
            if (launch() != 0) { /* declined (e.g. no tensor-map entry point): nothing queued */
                printf("  time alone: wgmma %s variant %d declined at hd %d\n",
                       a.kv ? "dK/dV" : "dQ   ", v, c.hd);
                continue;
            }
            const double us = mean_launch_us(stream(), 2, 10, launch);
            printf("  time alone: wgmma %s variant %d %8.1f us  %6.1f TFLOP/s\n",
                   a.kv ? "dK/dV" : "dQ   ", v, us, (a.kv ? fkv : fdq) / (us * 1e-6) / 1e12);
        }
        CK(cudaFree(d_ds));
        CK(cudaFree(d_D));
    }

    CK(cudaFree(d_qkv));
    CK(cudaFree(d_do));
    CK(cudaFree(d_out));
    CK(cudaFree(d_lse));
    for (int k = 0; k < NPATH; k++) CK(cudaFree(d_g[k]));
    CK(cudaFree(d_g2));
    free(h_qkv), free(h_do);
}

int main(int argc, char **argv) {
    bool timing = true, small = false, check = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-time") == 0) timing = false;
        else if (strcmp(argv[i], "--small") == 0) small = true, timing = false;
        else if (strcmp(argv[i], "--time-only") == 0) check = false;
        else if (strcmp(argv[i], "--no-ws") == 0) skip_ws = true;
        else {
            fprintf(stderr, "usage: %s [--no-time] [--small] [--time-only] [--no-ws]\n", argv[0]);
            return 2;
        }
    }
    if (const int skip = sm90_device_or_skip()) return skip;

    /* what the wgmma dK/dV pass must decline (the caller then falls back) */
    if (check) {
        void *d_a;
        CK(cudaMalloc(&d_a, 1 << 20));
        char *a = (char *)d_a;
        float *f = (float *)(a + (1 << 19));
        const int r96 = shlm_cuda_attention_bwd_dkv_sm90(a, a, 1, a, a, f, f, 0, 1, 64, 2, 2, 96,
                                                         0.1f, 0.1f, NULL);
        const int rmis = shlm_cuda_attention_bwd_dkv_sm90(a, a, 1, a, a + 2, f, f, 0, 1, 64, 2, 2,
                                                          128, 0.1f, 0.1f, NULL);
        const int rgqa = shlm_cuda_attention_bwd_dkv_sm90(a, a, 1, a, a, f, f, 0, 1, 64, 3, 2,
                                                          128, 0.1f, 0.1f, NULL);
        /* a RoPE table that is not 16-byte aligned: both passes decline */
        const int rrope = shlm_cuda_attention_bwd_dkv_sm90(a, a, 1, a, a, f, f, 0, 1, 64, 2, 2,
                                                           128, 0.1f, 0.1f, f + 2);
        const int rrq = shlm_cuda_attention_bwd_dq_sm90(a, a, 1, a, 0, 1, 64, 2, 2, 128, f + 2);
        const bool ok = r96 == 1 && rmis == 1 && rgqa == 1 && rrope == 1 && rrq == 1;
        printf("declines hd=96, misaligned qkv, nh %% nkv != 0, misaligned RoPE table (dK/dV, "
               "dQ): rc %d %d %d %d %d %s\n",
               r96, rmis, rgqa, rrope, rrq, ok ? "ok" : "FAIL");
        if (!ok) n_failed++;
        CK(cudaStreamSynchronize(stream()));
        CK(cudaFree(d_a));
    }

    const Case small_cases[] = {
        {2, 130, 4, 2, 128}, {2, 130, 4, 4, 128}, {2, 256, 4, 2, 128}, {2, 256, 4, 4, 128},
        {2, 130, 4, 2, 64},  {2, 130, 4, 4, 64},  {2, 256, 4, 2, 64},  {2, 256, 4, 4, 64},
    };
    const Case big_cases[] = {
        {2, 1000, 8, 2, 128},   /* GQA 4:1, T not a multiple of 64 */
        {2, 4096, 32, 32, 128}, /* two passes (b0 = 1 on the second) */
    };
    const Case time_cases[] = {{1, 4096, 32, 32, 128}, {1, 4096, 32, 32, 64}};
    if (check) {
        for (const Case &c : small_cases) run_case(c, true, false);
        if (!small)
            for (const Case &c : big_cases) run_case(c, true, false);
    }
    if (timing)
        for (const Case &c : time_cases) run_case(c, false, true);
    printf("%s: %d check(s) failed\n", n_failed ? "FAIL" : "PASS", n_failed);
    return n_failed ? 1 : 0;
}
