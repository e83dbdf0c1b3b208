/* GPU check of the attention backward's two implementations: the Hopper wgmma dK/dV and
 * dQ kernels (kernels/cuda/attention_bwd_sm90.cu, the default) against the portable
 * mma.sync kernels (kernels/cuda/attention.cu, the declared fallback), inside the whole
 * backward (shlm_cuda_attention_bwd: D, then per pass dK/dV and dQ), and both against a
 * float64 reference, causal and with document masks (ops.h doc_start), with timings.
 *
 * Build: `make check` in a CUDA build directory builds it (tests/gpu/attn_bwd_sm90_check),
 * or with nvcc alone (tests/gpu/attn_sm90_shim.cu stands in for the backend's stream,
 * scratch and fatal path), from the repository root:
 *   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -o attn_bwd_sm90_check \
 *       tests/gpu/attn_bwd_sm90_check.cu tests/gpu/attn_sm90_shim.cu kernels/cuda/attention.cu \
 *       kernels/cuda/attention_sm90.cu kernels/cuda/attention_bwd_sm90.cu kernels/cuda/rope.cu \
 *       kernels/rope_freq.c
 * Run (on a compute capability 9.0 GPU):
 *   attn_bwd_sm90_check              # every case, then timings
 *   attn_bwd_sm90_check --no-time    # correctness only (what `make check-gpu` runs)
 *   attn_bwd_sm90_check --small      # the small cases only (for compute-sanitizer)
 *   attn_bwd_sm90_check --time-only  # timings only
 * Exit status 0: all passed; 1: a check failed; 77: no compute capability 9.0 GPU.
 *
 * Inputs: q, k ~ N(0, 1.5²) (peaked softmax rows), v, dout ~ N(0, 1), bf16; out and lse
 * from shlm_cuda_attention_fwd; the causal mask or a layout of documents from
 * tests/doc_layout.h (several per tile, spanning tiles, single tokens, a start at T - 1).
 * Per case, with dqkv poisoned with NaN first:
 *   the default must have run the Hopper dK/dV and dQ kernels in every pass
 *     (shlm_cuda_attention_sm90_ran);
 *   NaN/unwritten: none of dq, dk, dv may be NaN;
 *   default and fallback bitwise equal (the same products in the same order);
 *   vs float64 (the cases small enough for the host, from the same bf16 inputs): relative
 *     L2 error of dq, dk, dv each < 1.5e-2 (P, dS and the outputs are rounded to bf16);
 *   determinism: a second run of the default is bitwise equal;
 *   causal cases: an all-zero doc_start (the document kernels) gives the bits of doc_start
 *     NULL, on the default and on the fallback.
 * With RoPE (default frequencies of theta 10000: dq, dk w.r.t. the pre-RoPE q, k; the wgmma
 * kernels rotate their fp32 accumulators before the one rounding to bf16, the fallback runs
 * rope.cu's inverse kernel on its bf16 output, rounding twice), both again:
 *   vs the host rotation (in double) of the fallback's unrotated result: relative L2 <
 *     1e-2 and max |d| / max |ref| < 2e-2 for dq, dk, dv (dv is not rotated);
 *   vs float64 rotated (small cases): < 1.5e-2;
 *   default vs fallback: relative L2 < 5e-3 and max |d| / max |ref| < 2e-2 for dq, dk (the
 *     two roundings differ by at most about one bf16 ulp, ~2^-8 of an element), dv
 *     bitwise equal; dv bitwise equal to the dv without RoPE; a second run bitwise equal.
 * On a failure the worst error is located (tensor, b, t, head, dim) and the max |diff| is
 * printed by key block (t % 128 / 16: warpgroup 0 is 0-3) × dim block (dim / 16).
 * Timings: the whole backward (D + dK/dV + dQ) of both, cudaEvent over 10 launches after 3
 * warm-up ones; TFLOP/s with 10·hd flops per (query, key) pair the mask keeps; the default
 * with RoPE fused, and without it followed by the separate inverse rope kernel; then the
 * Hopper dK/dV and dQ passes alone (4/5 and 1/5 of those flops). */
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
/* RoPE's default frequencies of theta ROPE_THETA for heads of hd (kernels/rope_freq.h) */
static const shlm_rope *rope_for(int hd) {
    static shlm_rope r;
    const shlm_rope_params p = {SHLM_ROPE_DEFAULT, ROPE_THETA, 0, 0, 0, 0};
    char why[256];
    if (r.head_dim != hd && shlm_rope_init(&r, hd, &p, why, sizeof why) != 0) {
        fprintf(stderr, "attn_bwd_sm90_check: %s\n", why);
        exit(1);
    }
    return &r;
}
static const char *const PART[3] = {"dq", "dk", "dv"};

/* ------------------------------------------------------------------ one case */

struct Inputs {
    void *qkv, *dout, *out;
    float *lse;
    int32_t *doc; /* doc_start (device) or NULL */
};

/* One backward on the default (sm90 = 1) or the fallback (0) into dst, first filled with
 * NaN (bf16 0xffff), waited for, copied to host. False, with the FAIL printed and counted,
 * when the default did not run the Hopper kernels in every pass; a CUDA error is sticky
 * and ends the check. */
static bool run_bwd(__nv_bfloat16 *host, void *dst, const Inputs &in, const int32_t *doc,
                    const Case &c, int sm90, const shlm_rope *rope) {
    const size_t n_qkv = (size_t)c.B * c.T * (c.nh + 2 * c.nkv) * c.hd;
    CK(cudaMemsetAsync(dst, 0xff, n_qkv * 2, stream()));
    shlm_cuda_attention_set_sm90(sm90);
    shlm_cuda_attention_bwd(dst, in.dout, in.qkv, in.out, in.lse, doc, c.B, c.T, c.nh, c.nkv,
                            c.hd, rope);
    CK(cudaStreamSynchronize(stream()));
    CK(cudaGetLastError());
    CK(cudaMemcpy(host, dst, n_qkv * 2, cudaMemcpyDeviceToHost));
    const unsigned want = sm90 ? SHLM_ATTN_RAN_SM90_DKV | SHLM_ATTN_RAN_SM90_DQ : 0u;
    const unsigned ran = shlm_cuda_attention_sm90_ran() & (SHLM_ATTN_RAN_SM90_DKV | SHLM_ATTN_RAN_SM90_DQ);
    if (ran == want) return true;
    printf("    FAIL: the %s ran dK/dV on %s, dQ on %s\n", sm90 ? "default" : "fallback",
           ran & SHLM_ATTN_RAN_SM90_DKV ? "wgmma" : "mma.sync",
           ran & SHLM_ATTN_RAN_SM90_DQ ? "wgmma" : "mma.sync");
    n_failed++;
    return false;
}

static void check_case(const Case &c, const Inputs &in, const __nv_bfloat16 *h_qkv,
                       const __nv_bfloat16 *h_do, const int32_t *h_doc, void *d_g) {
    const size_t n_qkv = (size_t)c.B * c.T * (c.nh + 2 * c.nkv) * c.hd;
    __nv_bfloat16 *h_fb = (__nv_bfloat16 *)malloc(n_qkv * 2), *h_df = (__nv_bfloat16 *)malloc(n_qkv * 2);
    __nv_bfloat16 *h_2 = (__nv_bfloat16 *)malloc(n_qkv * 2);
    __nv_bfloat16 *h_fbr = (__nv_bfloat16 *)malloc(n_qkv * 2), *h_dfr = (__nv_bfloat16 *)malloc(n_qkv * 2);
    float *f_fb = (float *)malloc(n_qkv * 4), *f_cpu = NULL;
    if (case_pairs(c, h_doc) * c.nh * c.hd < 6e8) {
        f_cpu = (float *)malloc(n_qkv * 4);
        ref_attention(NULL, NULL, f_cpu, h_qkv, h_do, h_doc, c);
    }
    char what[64];

    printf("  fallback (mma.sync)\n");
    const bool fb = run_bwd(h_fb, d_g, in, in.doc, c, 0, NULL);
    for (size_t i = 0; i < n_qkv; i++) f_fb[i] = bf(h_fb[i]);
    for (int part = 0; fb && f_cpu && part < 3; part++) {
        snprintf(what, sizeof what, "%s vs float64", PART[part]);
        check_part(what, part, h_fb, f_cpu, c, 1.5e-2, 0);
    }
    printf("  default (Hopper wgmma)\n");
    const bool df = run_bwd(h_df, d_g, in, in.doc, c, 1, NULL);
    if (df) {
        for (int part = 0; f_cpu && part < 3; part++) {
            snprintf(what, sizeof what, "%s vs float64", PART[part]);
            check_part(what, part, h_df, f_cpu, c, 1.5e-2, 0);
        }
        if (fb) report_same("bitwise equal to the fallback", memcmp(h_df, h_fb, n_qkv * 2) == 0);
        if (run_bwd(h_2, d_g, in, in.doc, c, 1, NULL))
            report_same("second run bitwise equal", memcmp(h_df, h_2, n_qkv * 2) == 0);
    }

    /* RoPE */
    const shlm_rope *theta = rope_for(c.hd);
    float *f_rot = (float *)malloc(n_qkv * 4), *f_fbr = (float *)malloc(n_qkv * 4);
    memcpy(f_rot, f_fb, n_qkv * 4);
    rope_inv_host(f_rot, c, ROPE_THETA);
    if (f_cpu) rope_inv_host(f_cpu, c, ROPE_THETA);
    printf("  fallback with RoPE\n");
    const bool fbr = fb && run_bwd(h_fbr, d_g, in, in.doc, c, 0, theta);
    for (size_t i = 0; i < n_qkv; i++) f_fbr[i] = bf(h_fbr[i]);
    for (int part = 0; fbr && part < 3; part++) {
        snprintf(what, sizeof what, "%s vs host-rotated", PART[part]);
        check_part(what, part, h_fbr, f_rot, c, 1e-2, 2e-2);
        if (f_cpu) {
            snprintf(what, sizeof what, "%s vs float64 rotated", PART[part]);
            check_part(what, part, h_fbr, f_cpu, c, 1.5e-2, 0);
        }
    }
    printf("  default with RoPE\n");
    if (df && run_bwd(h_dfr, d_g, in, in.doc, c, 1, theta)) {
        for (int part = 0; part < 3; part++) {
            snprintf(what, sizeof what, "%s vs host-rotated", PART[part]);
            check_part(what, part, h_dfr, f_rot, c, 1e-2, 2e-2);
            if (f_cpu) {
                snprintf(what, sizeof what, "%s vs float64 rotated", PART[part]);
                check_part(what, part, h_dfr, f_cpu, c, 1.5e-2, 0);
            }
            if (fbr && part < 2) {
                snprintf(what, sizeof what, "%s vs fallback+rope", PART[part]);
                check_part(what, part, h_dfr, f_fbr, c, 5e-3, 2e-2);
            }
        }
        if (fbr) report_same("dv bitwise equal to the fallback's", same_part(h_dfr, h_fbr, 2, c));
        report_same("dv bitwise equal to the dv without RoPE", same_part(h_dfr, h_df, 2, c));
        if (run_bwd(h_2, d_g, in, in.doc, c, 1, theta))
            report_same("second run bitwise equal", memcmp(h_dfr, h_2, n_qkv * 2) == 0);
    }
    if (!h_doc) { /* the document kernels on one document per sequence: the same bits */
        int32_t *d_zeros;
        CK(cudaMalloc(&d_zeros, (size_t)c.B * c.T * sizeof(int32_t)));
        CK(cudaMemset(d_zeros, 0, (size_t)c.B * c.T * sizeof(int32_t)));
        printf("  all-zero doc_start\n");
        if (fb && run_bwd(h_2, d_g, in, d_zeros, c, 0, NULL))
            report_same("fallback: zeros == NULL", memcmp(h_2, h_fb, n_qkv * 2) == 0);
        if (df && run_bwd(h_2, d_g, in, d_zeros, c, 1, NULL))
            report_same("default: zeros == NULL", memcmp(h_2, h_df, n_qkv * 2) == 0);
        if (fbr && run_bwd(h_2, d_g, in, d_zeros, c, 0, theta))
            report_same("fallback with RoPE: zeros == NULL", memcmp(h_2, h_fbr, n_qkv * 2) == 0);
        if (df && run_bwd(h_2, d_g, in, d_zeros, c, 1, theta))
            report_same("default with RoPE: zeros == NULL", memcmp(h_2, h_dfr, n_qkv * 2) == 0);
        CK(cudaFree(d_zeros));
    }
    free(h_fb), free(h_df), free(h_2), free(h_fbr), free(h_dfr), free(f_fb), free(f_cpu);
    free(f_rot), free(f_fbr);
}

static void time_case(const Case &c, const Inputs &in, const int32_t *h_doc, void *d_g) {
    const double flops = 10.0 * c.hd * c.nh * case_pairs(c, h_doc);
    for (int sm90 = 0; sm90 < 2; sm90++) {
        shlm_cuda_attention_set_sm90(sm90);
        auto launch = [&]() {
            shlm_cuda_attention_bwd(d_g, in.dout, in.qkv, in.out, in.lse, in.doc, c.B, c.T, c.nh,
                                    c.nkv, c.hd, NULL);
        };
        const double us = mean_launch_us(stream(), 3, 10, launch);
        printf("  time backward %-22s %8.1f us  %6.1f TFLOP/s\n",
               sm90 ? "default (wgmma)" : "fallback (mma.sync)", us, flops / (us * 1e-6) / 1e12);
    }
    /* RoPE on the default: fused into the epilogues, against the backward then the
     * separate inverse rope kernel over dqkv */
    shlm_cuda_attention_set_sm90(1);
    for (int fused = 1; fused >= 0; fused--) {
        const shlm_rope *theta = rope_for(c.hd);
        const int C3i = (c.nh + 2 * c.nkv) * c.hd;
        auto launch = [&]() {
            shlm_cuda_attention_bwd(d_g, in.dout, in.qkv, in.out, in.lse, in.doc, c.B, c.T, c.nh,
                                    c.nkv, c.hd, fused ? theta : NULL);
            if (!fused) shlm_cuda_rope(d_g, c.B * c.T, c.T, C3i, c.nh + c.nkv, theta, NULL, 1);
        };
        const double us = mean_launch_us(stream(), 3, 10, launch);
        printf("  time backward + RoPE, default, %-14s %8.1f us\n", fused ? "fused" : "then rope", us);
    }
    /* the Hopper passes alone (D left zero: the timing does not depend on it) */
    const int nq64 = (c.T + 63) / 64, m = nq64 >> 1;
    const size_t ds_head = (nq64 & 1) ? (size_t)(m + 1) * (m + 1) : (size_t)m * (m + 1);
    const size_t n_lse = (size_t)c.B * c.nh * c.T;
    void *d_ds;
    float *d_D;
    CK(cudaMalloc(&d_ds, (size_t)c.B * c.nh * ds_head * 8192 * 2));
    CK(cudaMalloc(&d_D, n_lse * 4));
    CK(cudaMemset(d_D, 0, n_lse * 4));
    const float scale = (float)(1.0 / sqrt((double)c.hd)), sl2 = scale * 1.4426950408889634f;
    for (int kv = 1; kv >= 0; kv--) {
        auto launch = [&]() -> int {
            if (kv)
                return shlm_cuda_attention_bwd_dkv_sm90(d_g, d_ds, ds_head, in.dout, in.qkv, in.lse,
                                                        d_D, in.doc, 0, c.B, c.T, c.nh, c.nkv, c.hd,
                                                        scale, sl2, NULL);
            return shlm_cuda_attention_bwd_dq_sm90(d_g, d_ds, ds_head, in.qkv, in.doc, 0, c.B, c.T,
                                                   c.nh, c.nkv, c.hd, NULL);
        };
        if (launch() != 0) {
            printf("  time alone: wgmma %s declined: FAIL\n", kv ? "dK/dV" : "dQ");
            n_failed++;
            continue;
        }
        const double us = mean_launch_us(stream(), 2, 10, launch);
        printf("  time alone: wgmma %s %8.1f us  %6.1f TFLOP/s\n", kv ? "dK/dV" : "dQ   ", us,
               (kv ? 0.8 : 0.2) * flops / (us * 1e-6) / 1e12);
    }
    CK(cudaFree(d_ds));
    CK(cudaFree(d_D));
}

static void run_case(const Case &c, bool check, bool timing) {
    print_case(c, "");
    const size_t C3 = (size_t)(c.nh + 2 * c.nkv) * c.hd;
    const size_t n_qkv = (size_t)c.B * c.T * C3, n_out = (size_t)c.B * c.T * c.nh * c.hd;
    const size_t n_lse = (size_t)c.B * c.nh * c.T;
    __nv_bfloat16 *h_qkv = (__nv_bfloat16 *)malloc(n_qkv * 2), *h_do = (__nv_bfloat16 *)malloc(n_out * 2);
    for (size_t i = 0; i < n_qkv; i++) {
        const bool is_v = (i % C3) >= (size_t)(c.nh + c.nkv) * c.hd;
        h_qkv[i] = __float2bfloat16(is_v ? gauss() : 1.5f * gauss());
    }
    for (size_t i = 0; i < n_out; i++) h_do[i] = __float2bfloat16(gauss());
    Inputs in;
    void *d_g;
    int32_t *h_doc = case_docs(c);
    in.doc = NULL;
    if (h_doc) {
        CK(cudaMalloc(&in.doc, (size_t)c.B * c.T * sizeof(int32_t)));
        CK(cudaMemcpy(in.doc, h_doc, (size_t)c.B * c.T * sizeof(int32_t), cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&in.qkv, n_qkv * 2));
    CK(cudaMalloc(&in.dout, n_out * 2));
    CK(cudaMalloc(&in.out, n_out * 2));
    CK(cudaMalloc(&in.lse, n_lse * 4));
    CK(cudaMalloc(&d_g, n_qkv * 2));
    CK(cudaMemcpy(in.qkv, h_qkv, n_qkv * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(in.dout, h_do, n_out * 2, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize()); /* the kernels run on the backend's non-blocking stream */
    shlm_cuda_attention_set_sm90(1);
    shlm_cuda_attention_fwd(in.out, in.lse, in.qkv, in.doc, c.B, c.T, c.nh, c.nkv, c.hd);
    CK(cudaStreamSynchronize(stream()));
    CK(cudaGetLastError());

    if (check) check_case(c, in, h_qkv, h_do, h_doc, d_g);
    if (timing) time_case(c, in, h_doc, d_g);

    CK(cudaFree(in.qkv));
    CK(cudaFree(in.dout));
    CK(cudaFree(in.out));
    CK(cudaFree(in.lse));
    CK(cudaFree(d_g));
    if (in.doc) CK(cudaFree(in.doc));
    free(h_qkv), free(h_do), free(h_doc);
}

int main(int argc, char **argv) {
    bool timing = true, small = false, check = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-time") == 0) timing = false;
        else if (strcmp(argv[i], "--small") == 0) small = true, timing = false;
        else if (strcmp(argv[i], "--time-only") == 0) check = false;
        else {
            fprintf(stderr, "usage: %s [--no-time] [--small] [--time-only]\n", argv[0]);
            return 2;
        }
    }
    if (const int skip = sm90_device_or_skip()) return skip;

    /* what the Hopper passes must decline (the caller then falls back) */
    if (check) {
        void *d_a;
        CK(cudaMalloc(&d_a, 1 << 20));
        char *a = (char *)d_a;
        float *f = (float *)(a + (1 << 19));
        const int r96 = shlm_cuda_attention_bwd_dkv_sm90(a, a, 1, a, a, f, f, NULL, 0, 1, 64, 2, 2, 96,
                                                         0.1f, 0.1f, NULL);
        const int rmis = shlm_cuda_attention_bwd_dkv_sm90(a, a, 1, a, a + 2, f, f, NULL, 0, 1, 64, 2, 2,
                                                          128, 0.1f, 0.1f, NULL);
        const int rgqa = shlm_cuda_attention_bwd_dkv_sm90(a, a, 1, a, a, f, f, NULL, 0, 1, 64, 3, 2,
                                                          128, 0.1f, 0.1f, NULL);
        /* a RoPE table that is not 16-byte aligned: both passes decline */
        const int rrope = shlm_cuda_attention_bwd_dkv_sm90(a, a, 1, a, a, f, f, NULL, 0, 1, 64, 2, 2,
                                                           128, 0.1f, 0.1f, f + 2);
        const int rrq = shlm_cuda_attention_bwd_dq_sm90(a, a, 1, a, NULL, 0, 1, 64, 2, 2, 128, f + 2);
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
        /* documents: several per tile, spanning tiles, single tokens, a start at T - 1 */
        {2, 130, 4, 2, 128, DOC_RANDOM, 40}, {2, 256, 4, 4, 128, DOC_SHORT, 2},
        {2, 256, 4, 2, 128, DOC_LAST, 100},  {2, 130, 4, 4, 64, DOC_LAST, 30},
        {2, 256, 4, 2, 64, DOC_RANDOM, 150}, {2, 256, 4, 4, 64, DOC_FIXED, 64},
    };
    const Case big_cases[] = {
        {2, 1000, 8, 2, 128},   /* GQA 4:1, T not a multiple of 64 */
        {2, 4096, 32, 32, 128}, /* two passes (b0 = 1 on the second) */
        {2, 1000, 8, 2, 128, DOC_RANDOM, 300},
        {3, 1000, 8, 8, 64, DOC_RANDOM, 200},
        {2, 4096, 32, 32, 128, DOC_FIXED, 512}, /* two passes */
    };
    const Case time_cases[] = {{1, 4096, 32, 32, 128}, {1, 4096, 32, 32, 64},
                               {1, 4096, 32, 32, 128, DOC_FIXED, 512},
                               {1, 4096, 32, 32, 64, DOC_FIXED, 512}};
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
