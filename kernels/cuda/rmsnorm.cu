/* cuda backend RMSNorm: out = x / sqrt(mean(x²) + eps) * weight (bf16, fp32 rstd), and
 * its backward into dinp (+=) and dweight (+=, fp32, deterministic two-stage sum). */
#include "kernels/cuda/cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

enum { RMS_THREADS = 256 };

/* One block per row. The row is read twice (sum of squares, then the scaled write); the
 * second read hits L1/L2, so device memory sees it once. */
__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_fwd_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *weight, int C,
                       float eps, bool vec, unsigned *amax_bits) {
    __shared__ float red[32];
    const size_t row = blockIdx.x;
    const bf16 *x = inp + row * C;
    bf16 *y = out + row * C;
    float ss = 0.0f;
    if (vec) {
        for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
            float f[8];
            load_bf16x8(f, x + c);
#pragma unroll
            for (int k = 0; k < 8; k++) ss += f[k] * f[k];
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float f = __bfloat162float(x[c]);
            ss += f * f;
        }
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / (float)C + eps);
    float m = 0.0f;
    if (vec) {
        for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
            float f[8], w[8];
            load_bf16x8(f, x + c);
            load_bf16x8(w, weight + c);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                f[k] = f[k] * r * w[k];
                m = fmaxf(m, fabsf(f[k]));
            }
            store_bf16x8(y + c, f);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float v = __bfloat162float(x[c]) * r * __bfloat162float(weight[c]);
            m = fmaxf(m, fabsf(v));
            y[c] = __float2bfloat16_rn(v);
        }
    }
    if (threadIdx.x == 0) rstd[row] = r;
    block_amax_merge(amax_bits, m, red);
}

/* The same with the row held in registers: C = 8·VPT·blockDim.x, each thread owns VPT
 * groups of 8 columns, so the row is read from memory once and the block is sized to
 * the row (every Llama width: 2048 -> 256 threads, 4096 -> 512, 5120 -> 320·2). */
template <int VPT>
__global__ void __launch_bounds__(512)
    rmsnorm_fwd_reg_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *weight, int C,
                           float eps, unsigned *amax_bits) {
    __shared__ float red[32];
    const size_t row = blockIdx.x;
    const bf16 *x = inp + row * C;
    bf16 *y = out + row * C;
    float f[VPT][8];
    float ss = 0.0f;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        load_bf16x8(f[v], x + (threadIdx.x + v * blockDim.x) * 8);
#pragma unroll
        for (int k = 0; k < 8; k++) ss += f[v][k] * f[v][k];
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / (float)C + eps);
    float m = 0.0f;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = (threadIdx.x + v * blockDim.x) * 8;
        float w[8];
        load_bf16x8(w, weight + c);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            f[v][k] = f[v][k] * r * w[k];
            m = fmaxf(m, fabsf(f[v][k]));
        }
        store_bf16x8(y + c, f[v]);
    }
    if (threadIdx.x == 0) rstd[row] = r;
    block_amax_merge(amax_bits, m, red);
}

/* Stage 1 of the backward with the row in registers (layout as rmsnorm_fwd_reg_kernel):
 * x, dy and the dx being added to are loaded once; each thread's dweight partial stays
 * in registers across its block's rows (same fixed order as rmsnorm_bwd_kernel below).
 * With one group of 8 per thread, the loads of the block's next row are issued before
 * this row's reduction, so that memory can stay busy through the barriers and stores
 * (the one-row-at-a-time form measured 51% of the copy ceiling at N = C = 4096 on an
 * H200). Rows are disjoint, so dinp may still alias dout. At most 512 threads (C <= 4096 with one
 * group of 8 per thread, <= 8192 with two) and two blocks per SM, so 64 registers:
 * enough for one group and the next row (no spills); two groups load row by row. */
template <int VPT>
__global__ void __launch_bounds__(512, 2)
    rmsnorm_bwd_reg_kernel(bf16 *dinp, float *partials, const bf16 *dout, const bf16 *inp,
                           const bf16 *weight, const float *rstd, int N, int C) {
    __shared__ float red[32];
    float w[VPT][8], part[VPT][8];
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        load_bf16x8(w[v], weight + (threadIdx.x + v * blockDim.x) * 8);
#pragma unroll
        for (int k = 0; k < 8; k++) part[v][k] = 0.0f;
    }
    /* rows held packed (8 bf16 in 16 bytes) until used: the current row and the next one
     * in flight fit the registers of two 512-thread blocks per SM */
    bf16x8 px[VPT], py[VPT], pd[VPT];
    auto load_row = [&](int row, bf16x8 (&ax)[VPT], bf16x8 (&ay)[VPT], bf16x8 (&ad)[VPT]) {
        const size_t o = (size_t)row * C;
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            const int c = (threadIdx.x + v * blockDim.x) * 8;
            ax[v] = *reinterpret_cast<const bf16x8 *>(inp + o + c);
            ay[v] = *reinterpret_cast<const bf16x8 *>(dout + o + c);
            ad[v] = *reinterpret_cast<const bf16x8 *>(dinp + o + c);
        }
    };
    /* the next row in flight with one group per thread; with two there is no register
     * room for it (it would spill), so each row is loaded at its turn */
    constexpr bool AHEAD = VPT == 1;
    int row = blockIdx.x;
    if (AHEAD && row < N) load_row(row, px, py, pd);
    for (; row < N; row += gridDim.x) {
        const int next = row + gridDim.x;
        bf16x8 nx[VPT], ny[VPT], nd[VPT];
        if (!AHEAD) load_row(row, px, py, pd);
        else if (next < N) load_row(next, nx, ny, nd);
        const float r = rstd[row];
        float dot = 0.0f;
#pragma unroll
        for (int v = 0; v < VPT; v++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float2 x2 = __bfloat1622float2(px[v].h[i]), y2 = __bfloat1622float2(py[v].h[i]);
                dot += y2.x * w[v][2 * i] * x2.x;
                dot += y2.y * w[v][2 * i + 1] * x2.y;
            }
        dot = block_sum(dot, red);
        const float kk = r * r * r * dot / (float)C;
        bf16 *dx = dinp + (size_t)row * C;
#pragma unroll
        for (int v = 0; v < VPT; v++) {
            float fd[8];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float2 x2 = __bfloat1622float2(px[v].h[i]), y2 = __bfloat1622float2(py[v].h[i]);
                const float2 d2 = __bfloat1622float2(pd[v].h[i]);
                part[v][2 * i] += y2.x * x2.x * r;
                part[v][2 * i + 1] += y2.y * x2.y * r;
                fd[2 * i] = d2.x + (r * w[v][2 * i] * y2.x - kk * x2.x);
                fd[2 * i + 1] = d2.y + (r * w[v][2 * i + 1] * y2.y - kk * x2.y);
            }
            store_bf16x8(dx + (threadIdx.x + v * blockDim.x) * 8, fd);
        }
        if (AHEAD && next < N) {
#pragma unroll
            for (int v = 0; v < VPT; v++) px[v] = nx[v], py[v] = ny[v], pd[v] = nd[v];
        }
    }
    float *dst = partials + (size_t)blockIdx.x * C;
#pragma unroll
    for (int v = 0; v < VPT; v++) {
        const int c = (threadIdx.x + v * blockDim.x) * 8;
#pragma unroll
        for (int k = 0; k < 8; k++) dst[c + k] = part[v][k];
    }
}

/* Stage 1 of the backward. Block g takes rows g, g + G, g + 2G, ... (G = gridDim.x, a
 * function of N only). Per row: dot = Σ_c dy·w·x, then
 *   dx += r·w·dy − r³/C·dot·x   and   part[c] += dy·x·r,
 * where each thread owns fixed columns of `part` (in shared memory), so the partial sums
 * run in a fixed order. Each element of dx is read and written by one thread after the
 * row's dot is complete, which is what lets dinp alias dout. The block's partial goes
 * to partials[g][C]. */
__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_bwd_kernel(bf16 *dinp, float *partials, const bf16 *dout, const bf16 *inp,
                       const bf16 *weight, const float *rstd, int N, int C, bool vec) {
    extern __shared__ float part[]; /* C */
    __shared__ float red[32];
    for (int c = threadIdx.x; c < C; c += blockDim.x) part[c] = 0.0f;
    /* the vector path gives a thread other columns (8 at a time) than this loop did */
    __syncthreads();
    for (int row = blockIdx.x; row < N; row += gridDim.x) {
        const bf16 *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
        bf16 *dx = dinp + (size_t)row * C;
        const float r = rstd[row];
        float dot = 0.0f;
        if (vec) {
            for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
                float fx[8], fy[8], fw[8];
                load_bf16x8(fx, x + c);
                load_bf16x8(fy, dy + c);
                load_bf16x8(fw, weight + c);
#pragma unroll
                for (int k = 0; k < 8; k++) dot += fy[k] * fw[k] * fx[k];
            }
        } else {
            for (int c = threadIdx.x; c < C; c += blockDim.x)
                dot += __bfloat162float(dy[c]) * __bfloat162float(weight[c]) *
                       __bfloat162float(x[c]);
        }
        dot = block_sum(dot, red);
        const float k = r * r * r * dot / (float)C;
        if (vec) {
            for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
                float fx[8], fy[8], fw[8], fd[8];
                load_bf16x8(fx, x + c);
                load_bf16x8(fy, dy + c);
                load_bf16x8(fw, weight + c);
                load_bf16x8(fd, dx + c);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    part[c + j] += fy[j] * fx[j] * r;
                    fd[j] += r * fw[j] * fy[j] - k * fx[j];
                }
                store_bf16x8(dx + c, fd);
            }
        } else {
            for (int c = threadIdx.x; c < C; c += blockDim.x) {
                float fx = __bfloat162float(x[c]), fy = __bfloat162float(dy[c]);
                float fw = __bfloat162float(weight[c]), fd = __bfloat162float(dx[c]);
                part[c] += fy * fx * r;
                dx[c] = __float2bfloat16_rn(fd + r * fw * fy - k * fx);
            }
        }
    }
    __syncthreads();
    float *dst = partials + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = part[c];
}

/* Stage 2: dweight[c] += Σ_g partials[g][c]. A block takes 32 columns (one per lane, so
 * each warp's loads are one 128-byte line); its 8 warps each sum a fixed eighth of the
 * groups in order, then warp 0 adds the eight sums in warp order: a fixed order, and
 * enough loads in flight that the 16 MB of partials stream at memory speed. */
enum { RMS_DW_WARPS = 8 };

__global__ void __launch_bounds__(RMS_DW_WARPS * 32)
    rmsnorm_dweight_kernel(float *dweight, const float *partials, int G, int C) {
    __shared__ float acc[RMS_DW_WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = blockIdx.x * 32 + lane;
    const int per = (G + RMS_DW_WARPS - 1) / RMS_DW_WARPS;
    const int g0 = warp * per, g1 = g0 + per < G ? g0 + per : G;
    float s = 0.0f;
    if (c < C)
        for (int g = g0; g < g1; g++) s += partials[(size_t)g * C + c];
    acc[warp][lane] = s;
    __syncthreads();
    if (warp == 0 && c < C) {
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < RMS_DW_WARPS; w++) total += acc[w][lane];
        dweight[c] += total;
    }
}

/* ------------------------------------------------------------------ launchers */

/* Row groups of the backward: fixed (not a function of the device) so that dweight has
 * the same bits on every GPU model. 256 blocks fill 132 SMs twice over; 1024 measured no
 * faster (H200, N = C = 4096) and quadruples the partials the second stage reads. */
enum { RMS_BWD_GROUPS = 256 };

/* Threads per row for the register kernels with VPT groups of 8 per thread: C/(8·VPT)
 * when that is a whole number of warps within 64..512 (their launch bounds), else 0
 * (use the loop kernels). */
static int reg_threads(int C, int VPT) {
    if (C % (8 * VPT) != 0) return 0;
    const int t = C / (8 * VPT);
    return t % 32 == 0 && t >= 64 && t <= 512 ? t : 0;
}

/* The register layout for C, or 0: one group per thread up to 512 threads, else two. */
static int reg_vpt(int C) {
    if (reg_threads(C, 1) && C / 8 <= 512) return 1;
    if (reg_threads(C, 2)) return 2;
    return 0;
}

extern "C" void shlm_cuda_rmsnorm_fwd(void *out, float *rstd, const void *inp, const void *weight,
                                      int N, int C, float eps, float *amax) {
    if (N <= 0 || C <= 0) return;
    unsigned *amax_bits = reinterpret_cast<unsigned *>(amax);
    bool vec = C % 8 == 0 && shlm_aligned(out, 16) && shlm_aligned(inp, 16) &&
               shlm_aligned(weight, 16);
    const int vpt = vec ? reg_vpt(C) : 0;
    if (vpt == 1) {
        rmsnorm_fwd_reg_kernel<1><<<N, reg_threads(C, 1), 0, shlm_cuda_stream()>>>(
            (bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)weight, C, eps, amax_bits);
        CUDA_CHECK_LAST();
        return;
    }
    if (vpt == 2) {
        rmsnorm_fwd_reg_kernel<2><<<N, reg_threads(C, 2), 0, shlm_cuda_stream()>>>(
            (bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)weight, C, eps, amax_bits);
        CUDA_CHECK_LAST();
        return;
    }
    rmsnorm_fwd_kernel<<<N, RMS_THREADS, 0, shlm_cuda_stream()>>>(
        (bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)weight, C, eps, vec, amax_bits);
    CUDA_CHECK_LAST();
}

extern "C" size_t shlm_cuda_rmsnorm_bwd_scratch(int N, int C) {
    if (N <= 0 || C <= 0) return 0;
    return (size_t)(N < RMS_BWD_GROUPS ? N : RMS_BWD_GROUPS) * C * sizeof(float);
}

extern "C" void shlm_cuda_rmsnorm_bwd(void *dinp, float *dweight, const void *dout,
                                      const void *inp, const void *weight, const float *rstd,
                                      int N, int C) {
    if (N <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && shlm_aligned(dinp, 16) && shlm_aligned(dout, 16) &&
               shlm_aligned(inp, 16) && shlm_aligned(weight, 16);
    const int G = N < RMS_BWD_GROUPS ? N : RMS_BWD_GROUPS;
    float *partials = (float *)shlm_cuda_scratch(shlm_cuda_rmsnorm_bwd_scratch(N, C));
    cudaStream_t s = shlm_cuda_stream();
    const int vpt = vec ? reg_vpt(C) : 0;
    if (vpt) {
        if (vpt == 1)
            rmsnorm_bwd_reg_kernel<1><<<G, reg_threads(C, 1), 0, s>>>(
                (bf16 *)dinp, partials, (const bf16 *)dout, (const bf16 *)inp,
                (const bf16 *)weight, rstd, N, C);
        else
            rmsnorm_bwd_reg_kernel<2><<<G, reg_threads(C, 2), 0, s>>>(
                (bf16 *)dinp, partials, (const bf16 *)dout, (const bf16 *)inp,
                (const bf16 *)weight, rstd, N, C);
        CUDA_CHECK_LAST();
        rmsnorm_dweight_kernel<<<(C + 31) / 32, RMS_DW_WARPS * 32, 0, s>>>(dweight, partials, G, C);
        CUDA_CHECK_LAST();
        return;
    }
    size_t smem = (size_t)C * sizeof(float);
    static size_t smem_set = 48 * 1024;
    if (smem > smem_set) { /* above 48 KiB a kernel must opt in */
        CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_bwd_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
        smem_set = smem;
    }
    rmsnorm_bwd_kernel<<<G, RMS_THREADS, smem, s>>>((bf16 *)dinp, partials, (const bf16 *)dout,
                                                    (const bf16 *)inp, (const bf16 *)weight,
                                                    rstd, N, C, vec);
    CUDA_CHECK_LAST();
    rmsnorm_dweight_kernel<<<(C + 31) / 32, RMS_DW_WARPS * 32, 0, s>>>(dweight, partials, G, C);
    CUDA_CHECK_LAST();
}
