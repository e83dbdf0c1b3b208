/* GPU check of the attention forward's two implementations: the Hopper wgmma kernel
 * (kernels/cuda/attention_sm90.cu, the default) against the portable mma.sync kernel
 * (kernels/cuda/attention.cu, the declared fallback) and both against a float64
 * reference, causal and with document masks (ops.h doc_start), with timings.
 *
 * Build: `make check` in a CUDA build directory builds it (tests/gpu/attn_sm90_check), or
 * with nvcc alone (tests/gpu/attn_sm90_shim.cu stands in for the backend's stream,
 * scratch and fatal path), from the repository root:
 *   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -o attn_sm90_check \
 *       tests/gpu/attn_sm90_check.cu tests/gpu/attn_sm90_shim.cu kernels/cuda/attention.cu \
 *       kernels/cuda/attention_sm90.cu kernels/cuda/attention_bwd_sm90.cu kernels/cuda/rope.cu
 * Run (on a compute capability 9.0 GPU):
 *   attn_sm90_check            # every case, then timings
 *   attn_sm90_check --no-time  # correctness only (what `make check-gpu` runs)
 *   compute-sanitizer attn_sm90_check --small   # the small cases, no timings
 * Exit status 0: all passed; 1: a check failed; 77: no compute capability 9.0 GPU.
 *
 * Per case (B, T, nh, nkv, hd, and the causal mask or a layout of documents from
 * tests/doc_layout.h: several per tile, spanning tiles, single tokens, a start at T - 1),
 * on random bf16 inputs (q, k ~ N(0, 1.5²) so that softmax rows are peaked and the running
 * max moves; v ~ N(0, 1)), outputs poisoned with NaN first:
 *   the default must have run the Hopper kernel (shlm_cuda_attention_sm90_ran), in the
 *     schedule the tile count picks (one block per tile, or persistent: both occur);
 *   out: max |default − fallback| / max |fallback| < 1e-2 (both round P and out to bf16),
 *        no NaN, no element left unwritten; lse: max |d| / max(1, |ref|) < 1e-3;
 *   both against float64 (the cases small enough for the host), same bounds;
 *   determinism: a second run of the default is bitwise equal (out and lse);
 *   causal cases: an all-zero doc_start (the document kernels) gives the bits of doc_start
 *     NULL, on the default and on the fallback.
 * On a failure the worst errors are printed by row block (query row % 128 / 16: warpgroup
 * 0 is rows 0-63) and column block (dim / 16), which points at the fragment at fault.
 * Timings: cudaEvent over 20 launches after 3 warm-up ones, TFLOP/s with
 * benchmarks/bench_kernels.c's count, 4·hd flops per (query, key) pair the mask keeps; the
 * default once more while another stream's kernel holds 16 SMs for about 100 us (as
 * NCCL's kernels do in training), which the persistent schedule must absorb. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "tests/gpu/attn_check.h"

/* ------------------------------------------------------------------ comparisons */

/* out (B·T, nh·hd) of `got` against `ref`; prints and returns whether it passed */
static bool check_out(const char *what, const __nv_bfloat16 *got, const float *ref, const Case &c,
                      double tol) {
    const size_t n = (size_t)c.B * c.T * c.nh * c.hd;
    double maxref = 0, maxdiff = 0, se = 0, sr = 0;
    size_t nbad = 0, worst = 0;
    float blk[8][8] = {{0}}; /* max |diff| by (row % 128) / 16, (dim % 128) / 16 */
    for (size_t i = 0; i < n; i++) {
        const double r = ref[i], g = bf(got[i]);
        const size_t row = i / ((size_t)c.nh * c.hd);
        const int t = (int)(row % c.T), d = (int)(i % c.hd);
        if (fabs(r) > maxref) maxref = fabs(r);
        if (isnan(g)) {
            nbad++;
            continue;
        }
        const double e = fabs(g - r);
        if (e > maxdiff) maxdiff = e, worst = i;
        se += e * e, sr += r * r;
        float &b = blk[(t % 128) / 16][(d % 128) / 16];
        if (e > b) b = (float)e;
    }
    const double rel = maxref > 0 ? maxdiff / maxref : maxdiff, l2 = sr > 0 ? sqrt(se / sr) : 0;
    const bool ok = nbad == 0 && rel < tol;
    const size_t wrow = worst / ((size_t)c.nh * c.hd);
    printf("    %-28s max|d|/max|ref| %.3e  relL2 %.3e  NaN/unwritten %zu  (tol %.0e) %s\n", what,
           rel, l2, nbad, tol, ok ? "ok" : "FAIL");
    if (!ok) {
        printf("      worst: b %zu t %zu head %zu dim %zu: got %g ref %g\n", wrow / c.T, wrow % c.T,
               (worst % ((size_t)c.nh * c.hd)) / c.hd, worst % c.hd, bf(got[worst]), ref[worst]);
        print_block_table(blk, c.hd);
        n_failed++;
    }
    return ok;
}

static bool check_lse(const char *what, const float *got, const float *ref, size_t n) {
    double worst = 0;
    size_t nbad = 0, wi = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) {
            nbad++;
            continue;
        }
        const double e = fabs((double)got[i] - ref[i]) / fmax(1.0, fabs((double)ref[i]));
        if (e > worst) worst = e, wi = i;
    }
    const bool ok = nbad == 0 && worst < 1e-3;
    printf("    %-28s max|d|/max(1,|ref|) %.3e  NaN/unwritten %zu  (tol 1e-03) %s\n", what, worst,
           nbad, ok ? "ok" : "FAIL");
    if (!ok) {
        printf("      worst at index %zu (b·nh·T + h·T + t): got %g ref %g\n", wi, got[wi], ref[wi]);
        n_failed++;
    }
    return ok;
}

/* ------------------------------------------------------------------ SMs held elsewhere */

/* Stands in for a kernel that holds SMs while attention runs (NCCL's, in training): each
 * block spins for `cycles` with so much shared memory that no attention block fits next
 * to it on its SM. */
__global__ void hog_kernel(long long cycles, int *sink) {
    extern __shared__ int hog_smem[];
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    if (cycles < 0) *sink = hog_smem[threadIdx.x]; /* never: keeps the shared memory */
}
constexpr int HOG_SMEM = 200 * 1024, HOG_BLOCKS = 16;

/* ------------------------------------------------------------------ one case */

static cudaStream_t stream(void) { return (cudaStream_t)shlm_cuda_stream_handle(); }

/* One forward on the default (sm90 = 1) or the fallback (0) into out, lse, first filled
 * with NaN, waited for. False, with the FAIL printed and counted, when the default did
 * not run the Hopper kernel; a CUDA error is sticky and ends the check. */
static bool run_fwd(void *out, float *lse, const void *qkv, const int32_t *doc, const Case &c,
                    int sm90) {
    const size_t n_out = (size_t)c.B * c.T * c.nh * c.hd, n_lse = (size_t)c.B * c.nh * c.T;
    CK(cudaMemsetAsync(out, 0xff, n_out * 2, stream())); /* bf16 0xffff: NaN */
    CK(cudaMemsetAsync(lse, 0xff, n_lse * 4, stream())); /* fp32 0xffffffff: NaN */
    shlm_cuda_attention_set_sm90(sm90);
    shlm_cuda_attention_fwd(out, lse, qkv, doc, c.B, c.T, c.nh, c.nkv, c.hd);
    CK(cudaStreamSynchronize(stream()));
    CK(cudaGetLastError());
    const bool ran = (shlm_cuda_attention_sm90_ran() & SHLM_ATTN_RAN_SM90_FWD) != 0;
    if (ran == (sm90 != 0)) return true;
    printf("    FAIL: the %s ran the %s kernel\n", sm90 ? "default" : "fallback",
           ran ? "Hopper" : "mma.sync");
    n_failed++;
    return false;
}

/* the bytes of two device buffers equal (out, or lse) */
static bool same_device(const void *a, const void *b, size_t bytes) {
    char *ha = (char *)malloc(bytes), *hb = (char *)malloc(bytes);
    CK(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost));
    const bool same = memcmp(ha, hb, bytes) == 0;
    free(ha), free(hb);
    return same;
}

static void run_case(const Case &c, bool timing) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const long tiles = (long)c.nh * ((c.T + 127) / 128) * c.B;
    char extra[96];
    snprintf(extra, sizeof extra, ": %ld tiles, %s schedule", tiles,
             tiles > sms ? "persistent" : "one block per tile");
    print_case(c, extra);
    int32_t *h_doc = case_docs(c), *d_doc = NULL;
    if (h_doc) {
        CK(cudaMalloc(&d_doc, (size_t)c.B * c.T * sizeof(int32_t)));
        CK(cudaMemcpy(d_doc, h_doc, (size_t)c.B * c.T * sizeof(int32_t), cudaMemcpyHostToDevice));
    }
    const double pairs = case_pairs(c, h_doc) * c.nh;
    const size_t C3 = (size_t)(c.nh + 2 * c.nkv) * c.hd;
    const size_t n_qkv = (size_t)c.B * c.T * C3, n_out = (size_t)c.B * c.T * c.nh * c.hd;
    const size_t n_lse = (size_t)c.B * c.nh * c.T;
    __nv_bfloat16 *h_qkv = (__nv_bfloat16 *)malloc(n_qkv * 2);
    for (size_t i = 0; i < n_qkv; i++) {
        const bool is_v = (i % C3) >= (size_t)(c.nh + c.nkv) * c.hd;
        h_qkv[i] = __float2bfloat16(is_v ? gauss() : 1.5f * gauss());
    }
    void *d_qkv, *d_ref, *d_new, *d_new2;
    float *d_lref, *d_lnew, *d_lnew2;
    CK(cudaMalloc(&d_qkv, n_qkv * 2));
    CK(cudaMalloc(&d_ref, n_out * 2));
    CK(cudaMalloc(&d_new, n_out * 2));
    CK(cudaMalloc(&d_new2, n_out * 2));
    CK(cudaMalloc(&d_lref, n_lse * 4));
    CK(cudaMalloc(&d_lnew, n_lse * 4));
    CK(cudaMalloc(&d_lnew2, n_lse * 4));
    CK(cudaMemcpy(d_qkv, h_qkv, n_qkv * 2, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize()); /* a pageable copy may still be in flight: the kernels run on
                                    the backend's non-blocking stream */

    __nv_bfloat16 *h_ref = (__nv_bfloat16 *)malloc(n_out * 2), *h_new = (__nv_bfloat16 *)malloc(n_out * 2),
                  *h_new2 = (__nv_bfloat16 *)malloc(n_out * 2);
    float *f_ref = (float *)malloc(n_out * 4), *l_ref = (float *)malloc(n_lse * 4),
          *l_new = (float *)malloc(n_lse * 4), *l_new2 = (float *)malloc(n_lse * 4);

    printf("  fallback (mma.sync)\n");
    run_fwd(d_ref, d_lref, d_qkv, d_doc, c, 0);
    CK(cudaMemcpy(h_ref, d_ref, n_out * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(l_ref, d_lref, n_lse * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n_out; i++) f_ref[i] = bf(h_ref[i]);

    /* the cases small enough for the host: both kernels against float64 */
    float *f_cpu = NULL, *l_cpu = NULL;
    if (pairs * c.hd < 1.5e9) {
        f_cpu = (float *)malloc(n_out * 4);
        l_cpu = (float *)malloc(n_lse * 4);
        ref_attention(f_cpu, l_cpu, NULL, h_qkv, NULL, h_doc, c);
        check_out("out vs float64", h_ref, f_cpu, c, 1e-2);
        check_lse("lse vs float64", l_ref, l_cpu, n_lse);
    }

    printf("  default (Hopper wgmma)\n");
    if (run_fwd(d_new, d_lnew, d_qkv, d_doc, c, 1)) {
        CK(cudaMemcpy(h_new, d_new, n_out * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(l_new, d_lnew, n_lse * 4, cudaMemcpyDeviceToHost));
        check_out("out vs fallback", h_new, f_ref, c, 1e-2);
        check_lse("lse vs fallback", l_new, l_ref, n_lse);
        if (f_cpu) {
            check_out("out vs float64", h_new, f_cpu, c, 1e-2);
            check_lse("lse vs float64", l_new, l_cpu, n_lse);
        }
        if (run_fwd(d_new2, d_lnew2, d_qkv, d_doc, c, 1)) {
            CK(cudaMemcpy(h_new2, d_new2, n_out * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(l_new2, d_lnew2, n_lse * 4, cudaMemcpyDeviceToHost));
            const bool same = memcmp(h_new, h_new2, n_out * 2) == 0 &&
                              memcmp(l_new, l_new2, n_lse * 4) == 0;
            printf("    %-28s %s\n", "second run bitwise equal", same ? "ok" : "FAIL");
            if (!same) n_failed++;
        }
    }
    if (!h_doc) { /* the document kernels on one document per sequence: the same bits */
        int32_t *d_zeros;
        CK(cudaMalloc(&d_zeros, (size_t)c.B * c.T * sizeof(int32_t)));
        CK(cudaMemset(d_zeros, 0, (size_t)c.B * c.T * sizeof(int32_t)));
        for (int sm90 = 1; sm90 >= 0; sm90--) {
            void *o = sm90 ? d_new : d_ref;
            float *l = sm90 ? d_lnew : d_lref;
            if (!run_fwd(d_new2, d_lnew2, d_qkv, d_zeros, c, sm90)) continue;
            const bool same = same_device(d_new2, o, n_out * 2) && same_device(d_lnew2, l, n_lse * 4);
            printf("    %-28s %s\n", sm90 ? "default: zeros == NULL" : "fallback: zeros == NULL",
                   same ? "ok" : "FAIL");
            if (!same) n_failed++;
        }
        CK(cudaFree(d_zeros));
    }

    if (timing) {
        const double flops = 4.0 * c.hd * pairs;
        for (int sm90 = 0; sm90 < 2; sm90++) {
            shlm_cuda_attention_set_sm90(sm90);
            auto launch = [&]() {
                shlm_cuda_attention_fwd(d_new, d_lnew, d_qkv, d_doc, c.B, c.T, c.nh, c.nkv, c.hd);
            };
            const double us = mean_launch_us(stream(), 3, 20, launch);
            printf("  time %-20s %9.1f us  %6.1f TFLOP/s\n", sm90 ? "default (wgmma)" : "fallback (mma.sync)",
                   us, flops / (us * 1e-6) / 1e12);
        }
        /* the default while HOG_BLOCKS SMs are held for about 100 us by another stream's
         * kernel (started first: a 20 us spin on this stream gives it the SMs) */
        cudaStream_t s2;
        cudaEvent_t e0, e1;
        CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaFuncSetAttribute(hog_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, HOG_SMEM));
        double tot = 0;
        for (int r = 0; r < 6; r++) {
            hog_kernel<<<HOG_BLOCKS, 32, HOG_SMEM, s2>>>(200000, NULL);
            hog_kernel<<<1, 32, 0, stream()>>>(40000, NULL);
            CK(cudaEventRecord(e0, stream()));
            shlm_cuda_attention_fwd(d_new, d_lnew, d_qkv, d_doc, c.B, c.T, c.nh, c.nkv, c.hd);
            CK(cudaEventRecord(e1, stream()));
            CK(cudaEventSynchronize(e1));
            CK(cudaStreamSynchronize(s2));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r > 0) tot += ms; /* the first is a warm-up */
        }
        CK(cudaGetLastError());
        printf("  time %-20s %9.1f us  with %d SMs held ~100 us\n", "default (wgmma)", 1e3 * tot / 5,
               HOG_BLOCKS);
        CK(cudaStreamDestroy(s2));
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
    }

    CK(cudaFree(d_qkv));
    CK(cudaFree(d_ref));
    CK(cudaFree(d_new));
    CK(cudaFree(d_new2));
    CK(cudaFree(d_lref));
    CK(cudaFree(d_lnew));
    CK(cudaFree(d_lnew2));
    free(h_qkv), free(h_ref), free(h_new), free(h_new2), free(f_ref), free(l_ref), free(l_new);
    free(l_new2), free(f_cpu), free(l_cpu), free(h_doc);
    if (d_doc) CK(cudaFree(d_doc));
}

int main(int argc, char **argv) {
    bool timing = true, small = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-time") == 0) timing = false;
        else if (strcmp(argv[i], "--small") == 0) small = true, timing = false;
        else {
            fprintf(stderr, "usage: %s [--no-time] [--small]\n", argv[0]);
            return 2;
        }
    }
    if (const int skip = sm90_device_or_skip()) return skip;

    /* what the Hopper kernel must decline (the caller then falls back) */
    {
        void *d_qkv, *d_out;
        float *d_lse;
        CK(cudaMalloc(&d_qkv, 1 << 20));
        CK(cudaMalloc(&d_out, 1 << 20));
        CK(cudaMalloc(&d_lse, 1 << 16));
        const int r96 = shlm_cuda_attention_fwd_sm90(d_out, d_lse, d_qkv, NULL, 1, 64, 2, 2, 96);
        const int rmis =
            shlm_cuda_attention_fwd_sm90(d_out, d_lse, (char *)d_qkv + 2, NULL, 1, 64, 2, 2, 128);
        const int rgqa = shlm_cuda_attention_fwd_sm90(d_out, d_lse, d_qkv, NULL, 1, 64, 3, 2, 128);
        const bool ok = r96 == 1 && rmis == 1 && rgqa == 1;
        printf("declines hd=96, misaligned qkv, nh %% nkv != 0: rc %d %d %d %s\n", r96, rmis, rgqa,
               ok ? "ok" : "FAIL");
        if (!ok) n_failed++;
        CK(cudaStreamSynchronize(stream()));
        CK(cudaFree(d_qkv));
        CK(cudaFree(d_out));
        CK(cudaFree(d_lse));
    }

    const Case cases[] = {
        {1, 130, 4, 4, 128},    /* two query tiles, the second one mostly padding */
        {2, 1000, 8, 2, 128},   /* GQA 4:1, T not a multiple of 128, two sequences: one wave */
        {2, 520, 20, 4, 128},   /* 200 tiles: persistent, small enough for float64 */
        {1, 4096, 32, 32, 128}, /* the benchmark shape */
        {1, 130, 4, 4, 64},
        {2, 1000, 8, 2, 64},
        {2, 520, 20, 4, 64},
        {1, 4096, 32, 32, 64},
        /* documents: one block per tile and persistent; single tokens; a start at T - 1 */
        {1, 130, 4, 4, 128, DOC_SHORT, 2},
        {2, 1000, 8, 2, 128, DOC_RANDOM, 300},
        {2, 520, 20, 4, 128, DOC_RANDOM, 100},
        {2, 1000, 8, 2, 128, DOC_LAST, 60},
        {1, 4096, 32, 32, 128, DOC_FIXED, 512},
        {1, 130, 4, 4, 64, DOC_LAST, 20},
        {2, 1000, 8, 2, 64, DOC_RANDOM, 300},
        {2, 520, 20, 4, 64, DOC_SHORT, 2},
        {1, 4096, 32, 32, 64, DOC_FIXED, 512},
    };
    for (const Case &c : cases)
        if (!small || c.T < 1000) run_case(c, timing && c.T == 4096);
    printf("%s: %d check(s) failed\n", n_failed ? "FAIL" : "PASS", n_failed);
    return n_failed ? 1 : 0;
}
