/* What tests/gpu/attn_sm90_check.cu and attn_bwd_sm90_check.cu share: the CUDA error
 * check, the failure count, a seeded host generator (the same sequence in both), the
 * shape of a case. Header-only, for those two standalone nvcc builds. */
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

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
static double uniform01(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return ((rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static float gauss(void) {
    return (float)(sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()));
}
static float bf(__nv_bfloat16 x) { return __bfloat162float(x); }

struct Case {
    int B, T, nh, nkv, hd;
};

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
