/* cuda backend token embedding: forward row gather from wte (V,C), backward scatter-add
 * of the output gradient into fp32 dwte, deterministic (no float atomics). */
#include "kernels/cuda/cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

/* One block per output row: a row copy, 16 bytes per thread per step when aligned. */
__global__ void embedding_fwd_kernel(bf16 *out, const int32_t *tokens, const bf16 *wte, int C,
                                     bool vec) {
    const int i = blockIdx.x;
    const bf16 *src = wte + (size_t)tokens[i] * C;
    bf16 *dst = out + (size_t)i * C;
    if (vec) {
        for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8)
            *reinterpret_cast<bf16x8 *>(dst + c) = *reinterpret_cast<const bf16x8 *>(src + c);
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
    }
}

/* Backward without atomics and without sorting (the signature does not carry V, so no
 * per-vocabulary-row grid can be sized): block (b, cb) owns every token id with
 * id % EMB_OWNERS == b, over the columns of chunk cb. It scans all N tokens in order,
 * compacts the positions it owns (a ballot keeps them in token order), and adds those
 * dout rows into its dwte rows. Each dwte element is written by exactly one thread and
 * sums its rows in token order, so the result is the same bits on every run. */
enum { EMB_OWNERS = 512, EMB_BWD_THREADS = 128, EMB_COLS_PER_THREAD = 8 };

__global__ void __launch_bounds__(EMB_BWD_THREADS)
    embedding_bwd_kernel(float *dwte, const bf16 *dout, const int32_t *tokens, int N, int C,
                         bool vec) {
    __shared__ int pos[EMB_BWD_THREADS];
    __shared__ int warp_count[EMB_BWD_THREADS / 32];
    const int owner = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c0 = (blockIdx.y * EMB_BWD_THREADS + threadIdx.x) * EMB_COLS_PER_THREAD;
    for (int base = 0; base < N; base += EMB_BWD_THREADS) {
        const int i = base + threadIdx.x;
        int tok = i < N ? tokens[i] : -1;
        bool mine = tok >= 0 && tok % EMB_OWNERS == owner;
        unsigned int ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) warp_count[warp] = __popc(ballot);
        __syncthreads();
        int offset = 0, total = 0;
#pragma unroll
        for (int w = 0; w < EMB_BWD_THREADS / 32; w++) {
            offset += w < warp ? warp_count[w] : 0;
            total += warp_count[w];
        }
        if (mine) pos[offset + __popc(ballot & ((1u << lane) - 1u))] = i;
        __syncthreads();
        for (int k = 0; k < total; k++) {
            const int r = pos[k];
            const int t = tokens[r];
            const bf16 *src = dout + (size_t)r * C;
            float *dst = dwte + (size_t)t * C;
            if (vec) {
                if (c0 < C) {
                    float f[8];
                    load_bf16x8(f, src + c0);
                    float4 *d4 = reinterpret_cast<float4 *>(dst + c0);
                    float4 a = d4[0], b = d4[1];
                    a.x += f[0]; a.y += f[1]; a.z += f[2]; a.w += f[3];
                    b.x += f[4]; b.y += f[5]; b.z += f[6]; b.w += f[7];
                    d4[0] = a;
                    d4[1] = b;
                }
            } else {
                for (int c = c0; c < c0 + EMB_COLS_PER_THREAD && c < C; c++)
                    dst[c] += __bfloat162float(src[c]);
            }
        }
        __syncthreads(); /* pos and warp_count are rewritten by the next chunk */
    }
}

/* ------------------------------------------------------------------ launchers */

extern "C" void shlm_cuda_embedding_fwd(void *out, const int32_t *tokens, const void *wte, int N,
                                        int C) {
    if (N <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && shlm_aligned(out, 16) && shlm_aligned(wte, 16);
    int threads = vec ? (C / 8 < 256 ? ((C / 8 + 31) / 32) * 32 : 256) : 256;
    embedding_fwd_kernel<<<N, threads, 0, shlm_cuda_stream()>>>((bf16 *)out, tokens,
                                                                (const bf16 *)wte, C, vec);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_embedding_bwd(float *dwte, const void *dout, const int32_t *tokens,
                                        int N, int C) {
    if (N <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && shlm_aligned(dout, 16) && shlm_aligned(dwte, 16);
    const int cols_per_block = EMB_BWD_THREADS * EMB_COLS_PER_THREAD;
    dim3 grid(EMB_OWNERS, (C + cols_per_block - 1) / cols_per_block);
    embedding_bwd_kernel<<<grid, EMB_BWD_THREADS, 0, shlm_cuda_stream()>>>(
        dwte, (const bf16 *)dout, tokens, N, C, vec);
    CUDA_CHECK_LAST();
}
