/* cuda backend bias of a linear layer: the add after the product (bf16, fp32 arithmetic)
 * and its gradient, the fp32 sum of the output gradient's rows. */
#include "kernels/cuda/cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

/* x(N,C) += bias(C): one thread per 8 consecutive columns of a row when C % 8 == 0 and
 * both pointers are 16-byte aligned, else one per element; a grid-stride loop. */
template <int VEC>
__global__ void bias_add_kernel(bf16 *x, const bf16 *bias, int N, int C) {
    const int per_row = C / VEC;
    const size_t total = (size_t)N * per_row;
    for (size_t it = (size_t)blockIdx.x * blockDim.x + threadIdx.x; it < total;
         it += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(it % per_row) * VEC;
        bf16 *row = x + (it / per_row) * C + c;
        if (VEC == 8) {
            float v[8], b[8];
            load_bf16x8(v, row);
            load_bf16x8(b, bias + c);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] += b[k];
            store_bf16x8(row, v);
        } else {
            row[0] = __float2bfloat16_rn(__bfloat162float(row[0]) + __bfloat162float(bias[c]));
        }
    }
}

/* dbias(C) (+)= the column sums of dout(N,C). A block owns BG_COLS columns: thread
 * (x, y) sums rows y, y + BG_LANES, ... of column x in fp32 (a warp reads 32 consecutive
 * columns of one row: coalesced), then the BG_LANES partial sums of a column are added in
 * a fixed tree order in shared memory. No atomics: the same bits on every run. */
enum { BG_COLS = 32, BG_LANES = 16 };

__global__ void bias_grad_kernel(float *dbias, const bf16 *dout, int N, int C, int set) {
    __shared__ float part[BG_LANES][BG_COLS];
    const int col = blockIdx.x * BG_COLS + threadIdx.x;
    float s = 0.0f;
    if (col < C)
        for (int r = threadIdx.y; r < N; r += BG_LANES)
            s += __bfloat162float(dout[(size_t)r * C + col]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    for (int half = BG_LANES / 2; half > 0; half /= 2) {
        if ((int)threadIdx.y < half) part[threadIdx.y][threadIdx.x] += part[threadIdx.y + half][threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.y == 0 && col < C) {
        const float total = part[0][threadIdx.x];
        dbias[col] = set ? total : dbias[col] + total;
    }
}

/* ------------------------------------------------------------------ launchers */

enum { EW_THREADS = 256 };

extern "C" void shlm_cuda_bias_add(void *x, const void *bias, int N, int C) {
    if (N <= 0 || C <= 0) return;
    cudaStream_t s = shlm_cuda_stream();
    const size_t cap = (size_t)shlm_cuda_sm_count() * 32;
    if (C % 8 == 0 && shlm_aligned(x, 16) && shlm_aligned(bias, 16))
        bias_add_kernel<8><<<shlm_cuda_blocks((size_t)N * C / 8, EW_THREADS, cap), EW_THREADS, 0,
                             s>>>((bf16 *)x, (const bf16 *)bias, N, C);
    else
        bias_add_kernel<1><<<shlm_cuda_blocks((size_t)N * C, EW_THREADS, cap), EW_THREADS, 0, s>>>(
            (bf16 *)x, (const bf16 *)bias, N, C);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_bias_grad(float *dbias, const void *dout, int N, int C, int set) {
    if (C <= 0) return;
    const dim3 block(BG_COLS, BG_LANES);
    const unsigned grid = (unsigned)((C + BG_COLS - 1) / BG_COLS);
    bias_grad_kernel<<<grid, block, 0, shlm_cuda_stream()>>>(dbias, (const bf16 *)dout,
                                                             N < 0 ? 0 : N, C, set);
    CUDA_CHECK_LAST();
}
