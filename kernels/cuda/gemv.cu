/* The products of a few rows (a decode step: one token a sequence): out(N, OC) = x(N, C) ·
 * Wᵀ (+ residual) for N <= SHLM_GEMV_MAX_ROWS, bf16 in and out, fp32 sums. At one row a
 * product is a pass over the weight with two FLOPs a weight element, so it runs at the
 * speed the weight streams from memory; cuBLASLt's GEMM kernels, tiled for many rows,
 * leave a good part of that bandwidth unused there. Each warp takes GEMV_R output rows
 * and streams their weight rows 16 bytes a lane, GEMV_U loads a row in flight, x read
 * through the cache (every warp reads all of it); then a warp sum. The order of the sum is
 * fixed: the same inputs give the same bits. */
#include "kernels/cuda/cuda_common.cuh"

enum { GEMV_WARPS = 8, GEMV_R = 2, GEMV_U = 4, GEMV_STEP = 32 * 8 };

__device__ __forceinline__ void unpack_bf16x8(float f[8], uint4 v) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_bf16_kernel(bf16 *out, const bf16 *x, const bf16 *w, const bf16 *residual, int C,
                     int OC) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int o0 = (blockIdx.x * GEMV_WARPS + warp) * GEMV_R;
    if (o0 >= OC) return;
    const bf16 *wr[GEMV_R];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) wr[r] = w + (size_t)min(o0 + r, OC - 1) * C;
    float acc[GEMV_R][NT];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    for (int c0 = lane * 8; c0 < C; c0 += GEMV_STEP * GEMV_U) {
        uint4 wv[GEMV_U][GEMV_R];
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            const int c = c0 + u * GEMV_STEP;
#pragma unroll
            for (int r = 0; r < GEMV_R; r++)
                wv[u][r] = c < C ? __ldcs(reinterpret_cast<const uint4 *>(wr[r] + c))
                                 : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            const int c = c0 + u * GEMV_STEP;
            if (c >= C) break;
            float wf[GEMV_R][8];
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) unpack_bf16x8(wf[r], wv[u][r]);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float xf[8];
                unpack_bf16x8(xf, __ldg(reinterpret_cast<const uint4 *>(x + (size_t)t * C + c)));
#pragma unroll
                for (int r = 0; r < GEMV_R; r++)
#pragma unroll
                    for (int k = 0; k < 8; k++) acc[r][t] = fmaf(xf[k], wf[r][k], acc[r][t]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) {
        const int o = o0 + r;
        if (o >= OC) break;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const size_t i = (size_t)t * OC + o;
            float v = acc[r][t];
            if (residual) v += __bfloat162float(residual[i]);
            out[i] = __float2bfloat16_rn(v);
        }
    }
}

template <int NT>
static void launch(bf16 *out, const bf16 *x, const bf16 *w, const bf16 *residual, int C, int OC) {
    const int per_block = GEMV_WARPS * GEMV_R;
    gemv_bf16_kernel<NT><<<(OC + per_block - 1) / per_block, GEMV_WARPS * 32, 0,
                           shlm_cuda_stream()>>>(out, x, w, residual, C, OC);
}

extern "C" int shlm_cuda_gemv(void *out, const void *inp, const void *weight, int N, int C,
                              int OC, const void *residual) {
    if (N < 1 || N > SHLM_GEMV_MAX_ROWS || C < 8 || C % 8 != 0 || OC < 1 ||
        !shlm_aligned(inp, 16) || !shlm_aligned(weight, 16))
        return 0;
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)inp, *w = (const bf16 *)weight, *r = (const bf16 *)residual;
    switch (N) {
    case 1: launch<1>(o, x, w, r, C, OC); break;
    case 2: launch<2>(o, x, w, r, C, OC); break;
    case 3: launch<3>(o, x, w, r, C, OC); break;
    case 4: launch<4>(o, x, w, r, C, OC); break;
    case 5: launch<5>(o, x, w, r, C, OC); break;
    case 6: launch<6>(o, x, w, r, C, OC); break;
    case 7: launch<7>(o, x, w, r, C, OC); break;
    default: launch<8>(o, x, w, r, C, OC); break;
    }
    CUDA_CHECK_LAST();
    return 1;
}
