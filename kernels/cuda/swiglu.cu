/* cuda backend SwiGLU: out = silu(gate) * up over rows of [gate | up] and its backward
 * (bf16, fp32 arithmetic). */
#include "kernels/cuda/cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + __expf(-x)); }

/* One thread per 8 consecutive features of a row when F % 8 == 0 (16-byte accesses), else
 * one per feature: a grid-stride loop calling item(r, j) for the N·F/VEC items, row r and
 * first feature j. */
template <int VEC, class Item>
__device__ __forceinline__ void for_each_item(int N, int F, Item item) {
    const int per_row = F / VEC;
    const size_t total = (size_t)N * per_row;
    for (size_t it = (size_t)blockIdx.x * blockDim.x + threadIdx.x; it < total;
         it += (size_t)gridDim.x * blockDim.x)
        item(it / per_row, (int)(it % per_row) * VEC);
}

/* amax_bits: ops.h's amax of what the kernel stores, or NULL (every kernel here) */
template <int VEC>
__global__ void swiglu_fwd_kernel(bf16 *out, const bf16 *gu, int N, int F, unsigned *amax_bits) {
    __shared__ float red[32];
    float m = 0.0f;
    for_each_item<VEC>(N, F, [&](size_t r, int j) {
        const bf16 *g = gu + r * 2 * F + j, *u = g + F;
        bf16 *o = out + r * F + j;
        if (VEC == 8) {
            float fg[8], fu[8];
            load_bf16x8(fg, g);
            load_bf16x8(fu, u);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                fg[k] = fg[k] * sigmoid_f(fg[k]) * fu[k];
                m = fmaxf(m, fabsf(fg[k]));
            }
            store_bf16x8(o, fg);
        } else {
            const float fg = __bfloat162float(g[0]), fu = __bfloat162float(u[0]);
            const float v = fg * sigmoid_f(fg) * fu;
            m = fmaxf(m, fabsf(v));
            o[0] = __float2bfloat16_rn(v);
        }
    });
    block_amax_merge(amax_bits, m, red);
}

/* dgate = dy·up·σ(g)·(1 + g·(1 − σ(g))),  dup = dy·g·σ(g). Both inputs of a pair are read
 * before either output is written, by the same thread, so dgu may alias gu. */
template <int VEC>
__global__ void swiglu_bwd_kernel(bf16 *dgu, const bf16 *dout, const bf16 *gu, int N, int F,
                                  unsigned *amax_bits) {
    __shared__ float red[32];
    float m = 0.0f;
    for_each_item<VEC>(N, F, [&](size_t r, int j) {
        const bf16 *g = gu + r * 2 * F + j, *u = g + F;
        const bf16 *dy = dout + r * F + j;
        bf16 *dg = dgu + r * 2 * F + j, *du = dg + F;
        if (VEC == 8) {
            float fg[8], fu[8], fy[8];
            load_bf16x8(fg, g);
            load_bf16x8(fu, u);
            load_bf16x8(fy, dy);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float s = sigmoid_f(fg[k]);
                const float dgk = fy[k] * fu[k] * s * (1.0f + fg[k] * (1.0f - s));
                fu[k] = fy[k] * fg[k] * s;
                fg[k] = dgk;
                m = fmaxf(m, fmaxf(fabsf(dgk), fabsf(fu[k])));
            }
            store_bf16x8(dg, fg);
            store_bf16x8(du, fu);
        } else {
            const float fg = __bfloat162float(g[0]), fu = __bfloat162float(u[0]);
            const float fy = __bfloat162float(dy[0]), s = sigmoid_f(fg);
            const float vg = fy * fu * s * (1.0f + fg * (1.0f - s)), vu = fy * fg * s;
            m = fmaxf(m, fmaxf(fabsf(vg), fabsf(vu)));
            dg[0] = __float2bfloat16_rn(vg);
            du[0] = __float2bfloat16_rn(vu);
        }
    });
    block_amax_merge(amax_bits, m, red);
}

/* ------------------------------------------------------------------ launchers */

enum { EW_THREADS = 256 };

static unsigned int ew_blocks(size_t work) {
    return shlm_cuda_blocks(work, EW_THREADS, (size_t)shlm_cuda_sm_count() * 32);
}

extern "C" void shlm_cuda_swiglu_fwd(void *out, const void *gu, int N, int F, float *amax) {
    if (N <= 0 || F <= 0) return;
    cudaStream_t s = shlm_cuda_stream();
    unsigned *bits = reinterpret_cast<unsigned *>(amax);
    if (F % 8 == 0 && shlm_aligned(out, 16) && shlm_aligned(gu, 16))
        swiglu_fwd_kernel<8><<<ew_blocks((size_t)N * F / 8), EW_THREADS, 0, s>>>(
            (bf16 *)out, (const bf16 *)gu, N, F, bits);
    else
        swiglu_fwd_kernel<1><<<ew_blocks((size_t)N * F), EW_THREADS, 0, s>>>(
            (bf16 *)out, (const bf16 *)gu, N, F, bits);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_swiglu_bwd(void *dgu, const void *dout, const void *gu, int N, int F,
                                     float *amax) {
    if (N <= 0 || F <= 0) return;
    cudaStream_t s = shlm_cuda_stream();
    unsigned *bits = reinterpret_cast<unsigned *>(amax);
    if (F % 8 == 0 && shlm_aligned(dgu, 16) && shlm_aligned(dout, 16) && shlm_aligned(gu, 16))
        swiglu_bwd_kernel<8><<<ew_blocks((size_t)N * F / 8), EW_THREADS, 0, s>>>(
            (bf16 *)dgu, (const bf16 *)dout, (const bf16 *)gu, N, F, bits);
    else
        swiglu_bwd_kernel<1><<<ew_blocks((size_t)N * F), EW_THREADS, 0, s>>>(
            (bf16 *)dgu, (const bf16 *)dout, (const bf16 *)gu, N, F, bits);
    CUDA_CHECK_LAST();
}
