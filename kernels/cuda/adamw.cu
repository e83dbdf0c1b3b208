/* cuda backend optimizer and reductions over flat fp32 buffers: fused AdamW with decoupled
 * weight decay, the sum of squares (for the gradient norm) and accumulation. */
#include "kernels/cuda/cuda_common.cuh"

#include <math.h>

/* ------------------------------------------------------------------ kernels */

/* One element of AdamW with the cpu backend's operation order. The explicit _rn
 * intrinsics stop nvcc from contracting a·b + c into one fused multiply-add (gcc on
 * x86-64 without -mfma does not), so both backends produce the same bits: the optimizer
 * state of a run must not depend on which backend stepped it. */
__device__ __forceinline__ void adamw_one(float &p, float g0, float &m, float &v, float lr,
                                          float b1, float b2, float eps, float wd, float gs,
                                          float bc1, float bc2) {
    const float g = __fmul_rn(g0, gs);
    const float mi = __fadd_rn(__fmul_rn(b1, m), __fmul_rn(__fsub_rn(1.0f, b1), g));
    const float vi = __fadd_rn(__fmul_rn(b2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, b2), g), g));
    m = mi;
    v = vi;
    const float mhat = __fmul_rn(mi, bc1), vhat = __fmul_rn(vi, bc2);
    const float upd = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), eps)), __fmul_rn(wd, p));
    p = __fsub_rn(p, __fmul_rn(lr, upd));
}

/* amax: NULL, or the bits of a float that takes the largest |param| written (ops.h) */
__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                             float lr, float b1, float b2, float eps, float wd, float gs,
                             float bc1, float bc2, bool vec, unsigned *amax) {
    __shared__ float red[32];
    float big = 0.0f;
    grid_stride_x4(
        n, vec,
        [&](size_t k) {
            float4 p = reinterpret_cast<float4 *>(param)[k];
            float4 g = reinterpret_cast<const float4 *>(grad)[k];
            float4 mm = reinterpret_cast<float4 *>(m)[k];
            float4 vv = reinterpret_cast<float4 *>(v)[k];
            adamw_one(p.x, g.x, mm.x, vv.x, lr, b1, b2, eps, wd, gs, bc1, bc2);
            adamw_one(p.y, g.y, mm.y, vv.y, lr, b1, b2, eps, wd, gs, bc1, bc2);
            adamw_one(p.z, g.z, mm.z, vv.z, lr, b1, b2, eps, wd, gs, bc1, bc2);
            adamw_one(p.w, g.w, mm.w, vv.w, lr, b1, b2, eps, wd, gs, bc1, bc2);
            reinterpret_cast<float4 *>(param)[k] = p;
            reinterpret_cast<float4 *>(m)[k] = mm;
            reinterpret_cast<float4 *>(v)[k] = vv;
            big = fmaxf(big, fmaxf(fmaxf(fabsf(p.x), fabsf(p.y)), fmaxf(fabsf(p.z), fabsf(p.w))));
        },
        [&](size_t k) {
            adamw_one(param[k], grad[k], m[k], v[k], lr, b1, b2, eps, wd, gs, bc1, bc2);
            big = fmaxf(big, fabsf(param[k]));
        });
    if (!amax) return; /* uniform over the grid: no thread of a block skips the barriers */
    big = block_max(big, red);
    if (threadIdx.x == 0) amax_merge(amax, big);
}

enum { SS_THREADS = 256, SS_MAX_BLOCKS = 1024, SS_MIN_BLOCK = 4096 };

/* Stage 1: block b sums x[b·bs, (b+1)·bs) in double (each thread a strided part, then a
 * fixed tree), writing part[b]. The block size bs is a function of n only (a multiple
 * of 4, so that every block starts 16-byte aligned when x does: 16-byte loads keep
 * enough bytes in flight for the memory system). */
__global__ void __launch_bounds__(SS_THREADS)
    sum_squares_kernel(double *part, const float *x, size_t n, size_t bs, bool vec) {
    __shared__ double red[SS_THREADS / 32];
    const size_t i0 = (size_t)blockIdx.x * bs;
    const size_t i1 = i0 + bs < n ? i0 + bs : n;
    double s = 0.0;
    size_t tail = i0;
    if (vec) {
        const size_t nv = (i1 - i0) / 4;
        const float4 *x4 = reinterpret_cast<const float4 *>(x + i0);
        for (size_t k = threadIdx.x; k < nv; k += blockDim.x) {
            const float4 f = x4[k];
            s += (double)f.x * f.x + (double)f.y * f.y + (double)f.z * f.z + (double)f.w * f.w;
        }
        tail = i0 + nv * 4;
    }
    for (size_t i = tail + threadIdx.x; i < i1; i += blockDim.x) {
        const double d = (double)x[i];
        s += d * d;
    }
    s = warp_sum_d(s);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) red[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < SS_THREADS / 32; w++) t += red[w];
        part[blockIdx.x] = t;
    }
}

/* Stage 2: the partials in block order, by one thread (at most 1024 of them). */
__global__ void sum_partials_kernel(double *out, const double *part, int nb) {
    double t = 0.0;
    for (int b = 0; b < nb; b++) t += part[b];
    *out = t;
}

__global__ void accumulate_kernel(float *y, const float *x, size_t n, bool vec) {
    grid_stride_x4(
        n, vec,
        [&](size_t k) {
            float4 a = reinterpret_cast<float4 *>(y)[k];
            const float4 b = reinterpret_cast<const float4 *>(x)[k];
            a.x += b.x;
            a.y += b.y;
            a.z += b.z;
            a.w += b.w;
            reinterpret_cast<float4 *>(y)[k] = a;
        },
        [&](size_t k) { y[k] += x[k]; });
}

/* ------------------------------------------------------------------ launchers */

enum { OPT_THREADS = 256 };

static unsigned int opt_blocks(size_t n) {
    return shlm_cuda_blocks((n + 3) / 4, OPT_THREADS, (size_t)shlm_cuda_sm_count() * 16);
}

extern "C" void shlm_cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n,
                                float lr, float beta1, float beta2, float eps,
                                float weight_decay, float grad_scale, int step, float *amax) {
    if (step < 1) SHLM_FATAL("adamw: step %d, but steps count from 1", step);
    if (n == 0) return;
    /* bias corrections in double on the host, as the cpu backend computes them */
    const float bc1 = (float)(1.0 / (1.0 - pow((double)beta1, step)));
    const float bc2 = (float)(1.0 / (1.0 - pow((double)beta2, step)));
    bool vec = shlm_aligned(param, 16) && shlm_aligned(grad, 16) && shlm_aligned(m, 16) &&
               shlm_aligned(v, 16);
    adamw_kernel<<<opt_blocks(n), OPT_THREADS, 0, shlm_cuda_stream()>>>(
        param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1, bc2, vec,
        reinterpret_cast<unsigned *>(amax));
    CUDA_CHECK_LAST();
}

/* at most SS_MAX_BLOCKS partials and the total */
extern "C" size_t shlm_cuda_sum_squares_scratch(void) {
    return (size_t)(SS_MAX_BLOCKS + 1) * sizeof(double);
}

extern "C" double shlm_cuda_sum_squares(const float *x, size_t n) {
    if (n == 0) return 0.0;
    size_t bs = (n + SS_MAX_BLOCKS - 1) / SS_MAX_BLOCKS;
    if (bs < SS_MIN_BLOCK) bs = SS_MIN_BLOCK;
    bs = (bs + 3) / 4 * 4;
    const int nb = (int)((n + bs - 1) / bs);
    double *part = (double *)shlm_cuda_scratch((size_t)(nb + 1) * sizeof(double));
    cudaStream_t s = shlm_cuda_stream();
    sum_squares_kernel<<<nb, SS_THREADS, 0, s>>>(part, x, n, bs, shlm_aligned(x, 16));
    CUDA_CHECK_LAST();
    sum_partials_kernel<<<1, 1, 0, s>>>(part + nb, part, nb);
    CUDA_CHECK_LAST();
    double total = 0.0;
    shlm_cuda_host_wait(s);
    CUDA_CHECK(cudaMemcpyAsync(&total, part + nb, sizeof total, cudaMemcpyDeviceToHost, s));
    shlm_cuda_host_wait(s);
    return total;
}

extern "C" void shlm_cuda_accumulate(float *y, const float *x, size_t n) {
    if (n == 0) return;
    accumulate_kernel<<<opt_blocks(n), OPT_THREADS, 0, shlm_cuda_stream()>>>(
        y, x, n, shlm_aligned(y, 16) && shlm_aligned(x, 16));
    CUDA_CHECK_LAST();
}

