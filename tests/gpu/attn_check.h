/* What tests/gpu/attn_sm90_check.cu and attn_bwd_sm90_check.cu share: the CUDA error
 * check, the failure count, a seeded host generator (the same sequence in both), the
 * shape of a case, the float64 reference, timing. Header-only, for those two standalone
 * nvcc builds. */
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "tests/doc_layout.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                    cudaGetErrorString(e_));                                              \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static int n_failed;

/* xorshift64, fixed seed: every run draws the same inputs */
static uint64_t rng = 0x5eed5eedull;
static uint64_t rnd64(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static double uniform01(void) { return ((rnd64() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static float gauss(void) {
    return (float)(sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()));
}
static float bf(__nv_bfloat16 x) { return __bfloat162float(x); }

/* doc_kind -1: the plain causal mask (doc_start NULL); else each sequence cut into
 * documents by doc_layout(doc_kind, maxlen) */
struct Case {
    int B, T, nh, nkv, hd;
    int doc_kind = -1, maxlen = 0;
};

/* The case's document starts (B·T, host), NULL for the causal mask; drawn from rnd64 */
static int32_t *case_docs(const Case &c) {
    if (c.doc_kind < 0) return NULL;
    int32_t *doc = (int32_t *)malloc((size_t)c.B * c.T * sizeof(int32_t));
    for (int b = 0; b < c.B; b++)
        doc_layout(doc + (size_t)b * c.T, c.T, (enum doc_layout_kind)c.doc_kind, c.maxlen, rnd64);
    return doc;
}

/* (query, key) pairs the case's mask keeps, per head */
static double case_pairs(const Case &c, const int32_t *doc) {
    double n = 0;
    for (int b = 0; b < c.B; b++)
        for (int t = 0; t < c.T; t++) n += t + 1 - (doc ? doc[(size_t)b * c.T + t] : 0);
    return n;
}

/* "B=.. T=.. nh=.. nkv=.. hd=..[, documents]" */
static void print_case(const Case &c, const char *extra) {
    printf("== B=%d T=%d nh=%d nkv=%d hd=%d%s%s%s\n", c.B, c.T, c.nh, c.nkv, c.hd,
           c.doc_kind < 0 ? "" : ", ", c.doc_kind < 0 ? "" : doc_layout_name((enum doc_layout_kind)c.doc_kind),
           extra);
}

/* Float64 attention on the host from the bf16 inputs: out (B·T, nh·hd) and lse (B, nh, T)
 * when non-NULL; with dout (B·T, nh·hd) non-NULL also the backward, dqkv (B·T, (nh +
 * 2·nkv)·hd). The mask written out: query i sees key j <= i of its own document (doc:
 * host doc_start, tokens of a document share their first token; NULL: one document). */
static void ref_attention(float *out, float *lse, float *dqkv, const __nv_bfloat16 *qkv,
                          const __nv_bfloat16 *dout, const int32_t *doc, const Case &c) {
    const int hd = c.hd, T = c.T;
    const size_t C3 = (size_t)(c.nh + 2 * c.nkv) * hd, CO = (size_t)c.nh * hd;
    const double scale = 1.0 / sqrt((double)hd);
    const size_t n = (size_t)c.B * T * C3;
    double *acc = dqkv ? (double *)calloc(n, sizeof(double)) : NULL;
    double *p = (double *)malloc(sizeof(double) * T), *o = (double *)malloc(sizeof(double) * hd);
    double *dp = (double *)malloc(sizeof(double) * T);
    auto X = [&](int b, int t, size_t col) { return (double)bf(qkv[((size_t)b * T + t) * C3 + col]); };
    for (int b = 0; b < c.B; b++)
        for (int h = 0; h < c.nh; h++) {
            const int kvh = h / (c.nh / c.nkv);
            const size_t qc = (size_t)h * hd, kc = (size_t)(c.nh + kvh) * hd,
                         vc = (size_t)(c.nh + c.nkv + kvh) * hd;
            for (int i = 0; i < T; i++) {
                const int32_t *row = doc ? doc + (size_t)b * T : NULL;
                auto sees = [&](int j) { return !row || row[j] == row[i]; };
                double mx = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    if (!sees(j)) continue;
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += X(b, i, qc + d) * X(b, j, kc + d);
                    p[j] = s * scale;
                    if (p[j] > mx) mx = p[j];
                }
                double sum = 0;
                for (int j = 0; j <= i; j++)
                    if (sees(j)) sum += (p[j] = exp(p[j] - mx));
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int j = 0; j <= i; j++) {
                    if (!sees(j)) continue;
                    p[j] /= sum;
                    for (int d = 0; d < hd; d++) o[d] += p[j] * X(b, j, vc + d);
                }
                const size_t orow = ((size_t)b * T + i) * CO + qc;
                if (out)
                    for (int d = 0; d < hd; d++) out[orow + d] = (float)o[d];
                if (lse) lse[((size_t)b * c.nh + h) * T + i] = (float)(mx + log(sum));
                if (!acc) continue;
                const __nv_bfloat16 *go = dout + orow;
                double D = 0;
                for (int d = 0; d < hd; d++) D += (double)bf(go[d]) * o[d];
                for (int j = 0; j <= i; j++) {
                    if (!sees(j)) continue;
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += (double)bf(go[d]) * X(b, j, vc + d);
                    dp[j] = p[j] * (s - D) * scale; /* dS */
                }
                double *dq = acc + ((size_t)b * T + i) * C3 + qc;
                for (int j = 0; j <= i; j++) {
                    if (!sees(j)) continue;
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
    if (acc)
        for (size_t i = 0; i < n; i++) dqkv[i] = (float)acc[i];
    free(acc), free(p), free(o), free(dp);
}

/* After a failed comparison: the max |diff| table by row block ((t % 128) / 16, rows) and
 * head-dim block (d / 16, columns; at most 8), which shows a wrong fragment or warp */
static void print_block_table(const float (&blk)[8][8], int hd) {
    printf("      max |diff| by row block (t%%128/16, rows) x dim block (d/16, columns):\n");
    for (int rb = 0; rb < 8; rb++) {
        printf("       ");
        for (int db = 0; db < hd / 16 && db < 8; db++) printf(" %9.2e", blk[rb][db]);
        printf("\n");
    }
}

/* Mean microseconds of one launch() on stream s: `warm` untimed launches, then `reps`
 * between two events. */
template <class F>
static double mean_launch_us(cudaStream_t s, int warm, int reps, F &&launch) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < warm; i++) launch();
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; i++) launch();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 1e3 * ms / reps;
}

/* 0 when device 0 has compute capability 9.0 (what the wgmma kernels need), else 77 (the
 * skip status), after saying why */
static int sm90_device_or_skip(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, compute capability %d.%d, %d SMs\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
    if (prop.major != 9 || prop.minor != 0) {
        printf("not a compute capability 9.0 device: skipped\n");
        return 77;
    }
    return 0;
}
