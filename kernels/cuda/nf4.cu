/* cuda backend NF4 dequantization (kernels/ops.h "NF4"): a region of an NF4 tensor to bf16,
 * reading its codes 16 bytes at a time, bit for bit the cpu's fp32 values rounded to bf16. */
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

/* The code books travel as kernel parameters (from kernels/nf4.c's tables, no device state)
 * and each block copies them to shared memory: a warp's level lookups hit up to 16 distinct
 * addresses, which shared memory serves in one pass and the constant bank would not. */
struct nf4_levels {
    float v[16];
};
struct nf4_dq_levels {
    float v[256];
};

enum {
    NF4_THREADS = 256,
    NF4_STEP = 32 /* values a vector step: 16 code bytes in, 64 bytes of bf16 out */
};

/* bf16 bits of lo (low half: the lower address) and hi, each rounded to nearest even */
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}

/* out[i] for the n values from `begin` (a multiple of 64) of the tensor whose codes start at
 * `codes`; scale(b) is block b's absmax, lv the 16 levels in shared memory. With vec
 * (codes + begin/2 and out 16-byte aligned) a thread step loads one uint4 of codes (32
 * values, half a block: one scale) and stores four uint4 of bf16; the values after the last
 * whole step, and every value without vec, go one code byte (two values) a step. Products
 * are __fmul_rn: one fp32 rounding whatever nvcc's contraction flags, as on the cpu. */
template <class Scale>
__device__ __forceinline__ void dequantize(bf16 *out, const uint8_t *codes, size_t begin, size_t n,
                                           bool vec, const float *lv, Scale scale) {
    const size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const uint8_t *c = codes + begin / 2;
    size_t done = 0;
    if (vec) {
        const size_t steps = n / NF4_STEP;
        for (size_t k = t0; k < steps; k += stride) {
            const uint4 w = reinterpret_cast<const uint4 *>(c)[k];
            const float a = scale((begin + k * NF4_STEP) / SHLM_NF4_BLOCK);
            const uint32_t word[4] = {w.x, w.y, w.z, w.w};
            uint32_t o[16];
#pragma unroll
            for (int j = 0; j < 16; j++) { /* code byte j (little-endian words): values 2j, 2j+1 */
                const uint32_t byte = word[j / 4] >> (8 * (j % 4)) & 0xFFu;
                o[j] = bf16x2_bits(__fmul_rn(lv[byte >> 4], a), __fmul_rn(lv[byte & 15u], a));
            }
            uint4 *dst = reinterpret_cast<uint4 *>(out) + 4 * k;
#pragma unroll
            for (int j = 0; j < 4; j++)
                dst[j] = make_uint4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
        }
        done = steps * NF4_STEP;
    }
    for (size_t p = done / 2 + t0; 2 * p < n; p += stride) {
        const uint32_t byte = c[p];
        const float a = scale((begin + 2 * p) / SHLM_NF4_BLOCK);
        out[2 * p] = __float2bfloat16_rn(__fmul_rn(lv[byte >> 4], a));
        if (2 * p + 1 < n) out[2 * p + 1] = __float2bfloat16_rn(__fmul_rn(lv[byte & 15u], a));
    }
}

__global__ void nf4_plain_kernel(bf16 *out, const uint8_t *codes, const float *absmax, size_t begin,
                                 size_t n, bool vec, nf4_levels levels) {
    __shared__ float lv[16];
    if (threadIdx.x < 16) lv[threadIdx.x] = levels.v[threadIdx.x];
    __syncthreads();
    dequantize(out, codes, begin, n, vec, lv, [&](size_t b) { return absmax[b]; });
}

/* double quant: absmax_b = fp32(fp32(dq[absmax_codes[b]] · absmax2[b / 256]) + offset),
 * the product and the sum rounded apart (kernels/nf4.h), not one fused multiply-add */
__global__ void nf4_dq_kernel(bf16 *out, const uint8_t *codes, const uint8_t *absmax_codes,
                              const float *absmax2, const float *offset, size_t begin, size_t n,
                              bool vec, nf4_levels levels, nf4_dq_levels dq) {
    __shared__ float lv[16], dv[256];
    if (threadIdx.x < 16) lv[threadIdx.x] = levels.v[threadIdx.x];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) dv[i] = dq.v[i];
    __syncthreads();
    const float off = *offset;
    dequantize(out, codes, begin, n, vec, lv, [&](size_t b) {
        return __fadd_rn(__fmul_rn(dv[absmax_codes[b]], absmax2[b / SHLM_NF4_DQ_GROUP]), off);
    });
}

/* ------------------------------------------------------------------ launchers */

extern "C" void shlm_cuda_nf4_dequantize(void *out, const shlm_nf4 *q, size_t begin, size_t end) {
    if (begin % SHLM_NF4_BLOCK || begin > end || end > q->n)
        SHLM_FATAL("nf4_dequantize: values [%zu, %zu) of a tensor of %zu: the region must start "
                   "on a block of %d and lie inside the tensor", begin, end, q->n, SHLM_NF4_BLOCK);
    const size_t n = end - begin;
    if (n == 0) return;
    const bool vec = shlm_aligned(q->codes + begin / 2, 16) && shlm_aligned(out, 16);
    const size_t work = vec ? (n + NF4_STEP - 1) / NF4_STEP : (n + 1) / 2;
    /* a grid-stride loop: enough blocks to fill every SM, each copying the levels once */
    const unsigned blocks = shlm_cuda_blocks(work, NF4_THREADS, (size_t)shlm_cuda_sm_count() * 8);
    cudaStream_t s = shlm_cuda_stream();
    nf4_levels levels;
    memcpy(levels.v, shlm_nf4_code, sizeof levels.v);
    if (q->absmax) {
        nf4_plain_kernel<<<blocks, NF4_THREADS, 0, s>>>((bf16 *)out, q->codes, q->absmax, begin, n,
                                                        vec, levels);
    } else {
        nf4_dq_levels dq;
        memcpy(dq.v, shlm_nf4_dq_code, sizeof dq.v);
        nf4_dq_kernel<<<blocks, NF4_THREADS, 0, s>>>((bf16 *)out, q->codes, q->absmax_codes,
                                                     q->absmax2, q->offset, begin, n, vec, levels, dq);
    }
    CUDA_CHECK_LAST();
}
