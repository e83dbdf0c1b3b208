/* cuda backend ops of LoRA's adapters (kernels/ops.h "LoRA"): scaling, the seeded dropout
 * (kernels/dropout_mask.h: the cpu's mask bit for bit), sub-matrix copies, and DoRA's row and
 * column dot products and scale; bf16 activations, fp32 arithmetic, sums in fixed orders. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/dropout_mask.h"

/* ------------------------------------------------------------------ kernels */

__global__ void scale_kernel(bf16 *x, size_t n, float a) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * a);
}

__global__ void dropout_kernel(bf16 *out, const bf16 *x, int N, int T, int C, uint32_t thr,
                               float k, const uint64_t *row_keys, uint64_t salt, int add) {
    const size_t total = (size_t)N * C;
    for (size_t it = (size_t)blockIdx.x * blockDim.x + threadIdx.x; it < total;
         it += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(it / C), c = (int)(it % C);
        const uint64_t idx = (uint64_t)(i % T) * (uint64_t)C + (uint64_t)c;
        const float v = shlm_dropout_keep(row_keys[i / T], salt, idx, thr)
                            ? __bfloat162float(x[it]) * k : 0.0f;
        out[it] = __float2bfloat16_rn(add ? __bfloat162float(out[it]) + v : v);
    }
}

__global__ void f32_add2d_kernel(float *dst, size_t dld, const float *src, size_t sld, int rows,
                                 int cols, int set) {
    const size_t total = (size_t)rows * cols;
    for (size_t it = (size_t)blockIdx.x * blockDim.x + threadIdx.x; it < total;
         it += (size_t)gridDim.x * blockDim.x) {
        const size_t i = it / cols, c = it % cols;
        const float v = src[i * sld + c];
        dst[i * dld + c] = set ? v : dst[i * dld + c] + v;
    }
}

/* One warp a row: lane l sums columns l, l + 32, ... in order, then warp_sum's fixed tree. */
__global__ void row_dot_kernel(float *out, const bf16 *a, const bf16 *b, int rows, int cols,
                               float coef, int add) {
    const int warps = blockDim.x / 32, lane = threadIdx.x & 31;
    for (int j = blockIdx.x * warps + threadIdx.x / 32; j < rows; j += gridDim.x * warps) {
        const bf16 *ar = a + (size_t)j * cols, *br = b + (size_t)j * cols;
        float s = 0.0f;
        for (int c = lane; c < cols; c += 32) s += __bfloat162float(ar[c]) * __bfloat162float(br[c]);
        s = warp_sum(s);
        if (lane == 0) out[j] = add ? out[j] + coef * s : coef * s;
    }
}

/* A block owns CD_COLS columns: thread (x, y) sums rows y, y + CD_LANES, ... of column x,
 * then the CD_LANES partial sums of a column are added in a fixed tree order (bias.cu's
 * column sums). */
enum { CD_COLS = 32, CD_LANES = 16 };

__global__ void col_dot_kernel(float *out, const bf16 *a, const bf16 *b, int ld, const float *n2,
                               int N, int C, int set) {
    __shared__ float part[CD_LANES][CD_COLS];
    const int col = blockIdx.x * CD_COLS + threadIdx.x;
    float s = 0.0f;
    if (col < C)
        for (int r = threadIdx.y; r < N; r += CD_LANES)
            s += __bfloat162float(a[(size_t)r * ld + col]) * __bfloat162float(b[(size_t)r * ld + col]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    for (int half = CD_LANES / 2; half > 0; half /= 2) {
        if ((int)threadIdx.y < half) part[threadIdx.y][threadIdx.x] += part[threadIdx.y + half][threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.y == 0 && col < C) {
        const float v = part[0][threadIdx.x] / sqrtf(n2[col]);
        out[col] = set ? v : out[col] + v;
    }
}

__global__ void dora_scale_kernel(bf16 *out, const bf16 *x, const bf16 *res, int ld, const bf16 *m,
                                  const float *n2, int N, int C) {
    const size_t total = (size_t)N * C;
    for (size_t it = (size_t)blockIdx.x * blockDim.x + threadIdx.x; it < total;
         it += (size_t)gridDim.x * blockDim.x) {
        const size_t i = it / C, c = it % C, at = i * (size_t)ld + c;
        const float g = __bfloat162float(m[c]) / sqrtf(n2[c]);
        const float r = res ? __bfloat162float(res[at]) : 0.0f;
        out[at] = __float2bfloat16_rn(r + g * __bfloat162float(x[at]));
    }
}

/* ------------------------------------------------------------------ launchers */

enum { EW_THREADS = 256 };

static unsigned grid_for(size_t work) {
    return shlm_cuda_blocks(work, EW_THREADS, (size_t)shlm_cuda_sm_count() * 32);
}

extern "C" void shlm_cuda_scale(void *x, size_t n, float a) {
    if (n == 0) return;
    scale_kernel<<<grid_for(n), EW_THREADS, 0, shlm_cuda_stream()>>>((bf16 *)x, n, a);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_dropout(void *out, const void *x, int N, int T, int C, float p,
                                  const uint64_t *row_keys, uint64_t salt, int add) {
    if (N <= 0 || C <= 0) return;
    dropout_kernel<<<grid_for((size_t)N * C), EW_THREADS, 0, shlm_cuda_stream()>>>(
        (bf16 *)out, (const bf16 *)x, N, T, C, shlm_dropout_threshold(p), 1.0f / (1.0f - p),
        row_keys, salt, add);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_copy2d(void *dst, size_t dld, const void *src, size_t sld, int rows,
                                 int cols) {
    if (rows <= 0 || cols <= 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dld * sizeof(bf16), src, sld * sizeof(bf16),
                                 (size_t)cols * sizeof(bf16), (size_t)rows,
                                 cudaMemcpyDeviceToDevice, shlm_cuda_stream()));
}

extern "C" void shlm_cuda_f32_add2d(float *dst, size_t dld, const float *src, size_t sld, int rows,
                                    int cols, int set) {
    if (rows <= 0 || cols <= 0) return;
    f32_add2d_kernel<<<grid_for((size_t)rows * cols), EW_THREADS, 0, shlm_cuda_stream()>>>(
        dst, dld, src, sld, rows, cols, set);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_row_dot(float *out, const void *a, const void *b, int rows, int cols,
                                  float coef, int add) {
    if (rows <= 0) return;
    const int warps = EW_THREADS / 32;
    const unsigned grid = shlm_cuda_blocks((size_t)rows, warps, (size_t)shlm_cuda_sm_count() * 32);
    row_dot_kernel<<<grid, EW_THREADS, 0, shlm_cuda_stream()>>>(out, (const bf16 *)a,
                                                               (const bf16 *)b, rows, cols, coef, add);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_col_dot(float *out, const void *a, const void *b, int ld, const float *n2,
                                  int N, int C, int set) {
    if (C <= 0) return;
    const dim3 block(CD_COLS, CD_LANES);
    const unsigned grid = (unsigned)((C + CD_COLS - 1) / CD_COLS);
    col_dot_kernel<<<grid, block, 0, shlm_cuda_stream()>>>(out, (const bf16 *)a, (const bf16 *)b,
                                                           ld, n2, N < 0 ? 0 : N, C, set);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_dora_scale(void *out, const void *x, const void *residual, int ld,
                                     const void *m, const float *n2, int N, int C) {
    if (N <= 0 || C <= 0) return;
    dora_scale_kernel<<<grid_for((size_t)N * C), EW_THREADS, 0, shlm_cuda_stream()>>>(
        (bf16 *)out, (const bf16 *)x, (const bf16 *)residual, ld, (const bf16 *)m, n2, N, C);
    CUDA_CHECK_LAST();
}
