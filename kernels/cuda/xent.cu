/* cuda backend softmax cross-entropy: one block per row, an online max/sum over V, the
 * per-row loss and, in the same launch, dlogits = (softmax − onehot)·dscale in bf16. */
#include "kernels/cuda/cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

enum { XENT_THREADS = 512 };

/* Merges (m2, s2) into (m, s), where s is a sum of exp(x − m). -inf maxima (nothing seen
 * yet) must not produce inf − inf = NaN. */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2;
        s = s2;
        return;
    }
    const float mx = fmaxf(m, m2);
    s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
    m = mx;
}

/* Pass 1 reads the row once keeping a running (max, sum) per thread, merged over the
 * block; pass 2 re-reads it (from L2: a 32000-wide bf16 row is 64 KB) and writes the
 * gradient. Each element is read and written by one thread, so dlogits may alias
 * logits; the target logit is read before the barrier that precedes any write. */
__global__ void __launch_bounds__(XENT_THREADS)
    xent_kernel(float *losses, bf16 *dlogits, const bf16 *logits, const int32_t *targets, int V,
                float dscale, bool vec) {
    __shared__ float sm_m[XENT_THREADS / 32], sm_s[XENT_THREADS / 32];
    const size_t row = blockIdx.x;
    const bf16 *x = logits + row * V;
    bf16 *dx = dlogits ? dlogits + row * V : NULL;
    const int tgt = targets[row];
    if (tgt < 0 || tgt >= V) {
        /* ignored row (or a target outside the vocabulary, which the device cannot abort
         * on: NaN makes the step's loss show it) */
        if (threadIdx.x == 0) losses[row] = tgt < 0 ? 0.0f : __int_as_float(0x7fc00000);
        if (dx) {
            for (int j = threadIdx.x; j < V; j += blockDim.x) dx[j] = __float2bfloat16_rn(0.0f);
        }
        return;
    }
    const float xt = __bfloat162float(x[tgt]);
    float m = -INFINITY, s = 0.0f;
    if (vec) {
        for (int j = threadIdx.x * 8; j < V; j += blockDim.x * 8) {
            float f[8];
            load_bf16x8(f, x + j);
            float vm = f[0];
#pragma unroll
            for (int k = 1; k < 8; k++) vm = fmaxf(vm, f[k]);
            float vs = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) vs += __expf(f[k] - vm);
            lse_merge(m, s, vm, vs);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) lse_merge(m, s, __bfloat162float(x[j]), 1.0f);
    }
    /* warp, then block merge of the (max, sum) pairs */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sm_m[warp] = m;
        sm_s[warp] = s;
    }
    __syncthreads();
    m = -INFINITY;
    s = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) lse_merge(m, s, sm_m[w], sm_s[w]);
    const float lse = m + logf(s);
    if (threadIdx.x == 0) losses[row] = lse - xt;
    if (!dx) return;
    if (vec) {
        for (int j = threadIdx.x * 8; j < V; j += blockDim.x * 8) {
            float f[8];
            load_bf16x8(f, x + j);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float p = __expf(f[k] - lse);
                f[k] = (j + k == tgt ? p - 1.0f : p) * dscale;
            }
            store_bf16x8(dx + j, f);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            const float p = __expf(__bfloat162float(x[j]) - lse);
            dx[j] = __float2bfloat16_rn((j == tgt ? p - 1.0f : p) * dscale);
        }
    }
}

/* ------------------------------------------------------------------ launchers */

extern "C" void shlm_cuda_xent_fwd_bwd(float *losses, void *dlogits, const void *logits,
                                       const int32_t *targets, int N, int V, float dscale) {
    if (N <= 0 || V <= 0) return;
    bool vec = V % 8 == 0 && shlm_aligned(logits, 16) && (!dlogits || shlm_aligned(dlogits, 16));
    xent_kernel<<<N, XENT_THREADS, 0, shlm_cuda_stream()>>>(
        losses, (bf16 *)dlogits, (const bf16 *)logits, targets, V, dscale, vec);
    CUDA_CHECK_LAST();
}
