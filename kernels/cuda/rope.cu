/* cuda backend rotary position embedding, Hugging Face rotate-half layout, in place on
 * the first n_heads heads of every row: element i pairs with i + hd/2 (cpu: rope.c). */
#include "kernels/cuda/cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

/* cos/sin of every (position, frequency), in double as the cpu backend does: the angle
 * pos·freq reaches thousands of radians, where an fp32 angle loses ~1e-4 of it. Built
 * once per (positions, head_dim, theta) and kept: the model calls rope with the same
 * three every time. */
__global__ void rope_table_kernel(float2 *tab, int npos, int half, int head_dim, double theta) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)npos * half) return;
    const int p = (int)(i / half), f = (int)(i % half);
    const double freq = pow(theta, -2.0 * f / head_dim);
    double s, c;
    sincos((double)p * freq, &s, &c);
    tab[i] = make_float2((float)c, (float)s);
}

/* One thread per (row, head, group of PAIRS frequency pairs): it loads PAIRS elements of
 * the lower half and PAIRS of the upper half (16 bytes each when PAIRS = 8). The inverse
 * rotation only flips the sine. */
template <int PAIRS>
__global__ void rope_kernel(bf16 *x, const float2 *tab, int N, int T, int stride, int n_heads,
                            int half, float sign) {
    const int groups = half / PAIRS;
    const size_t total = (size_t)N * n_heads * groups;
    for (size_t it = (size_t)blockIdx.x * blockDim.x + threadIdx.x; it < total;
         it += (size_t)gridDim.x * blockDim.x) {
        const int g = (int)(it % groups);
        const size_t rh = it / groups;
        const int h = (int)(rh % n_heads);
        const int r = (int)(rh / n_heads);
        bf16 *lo = x + (size_t)r * stride + (size_t)h * 2 * half + g * PAIRS;
        bf16 *hi = lo + half;
        const float2 *cs = tab + (size_t)(r % T) * half + g * PAIRS;
        if (PAIRS == 8) {
            float a[8], b[8];
            load_bf16x8(a, lo);
            load_bf16x8(b, hi);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float2 t = cs[i];
                const float s = sign * t.y, c = t.x;
                const float ai = a[i], bi = b[i];
                a[i] = ai * c - bi * s;
                b[i] = bi * c + ai * s;
            }
            store_bf16x8(lo, a);
            store_bf16x8(hi, b);
        } else {
#pragma unroll
            for (int i = 0; i < PAIRS; i++) {
                const float2 t = cs[i];
                const float s = sign * t.y, c = t.x;
                const float ai = __bfloat162float(lo[i]), bi = __bfloat162float(hi[i]);
                lo[i] = __float2bfloat16_rn(ai * c - bi * s);
                hi[i] = __float2bfloat16_rn(bi * c + ai * s);
            }
        }
    }
}

/* ------------------------------------------------------------------ launchers */

static float2 *g_tab;
static int g_tab_npos, g_tab_hd;
static float g_tab_theta;

static const float2 *rope_table(int npos, int head_dim, float theta) {
    if (g_tab && npos <= g_tab_npos && head_dim == g_tab_hd && theta == g_tab_theta)
        return g_tab;
    const int half = head_dim / 2;
    /* cudaFree waits for kernels still reading the old table */
    CUDA_CHECK(cudaFree(g_tab));
    g_tab = NULL;
    CUDA_CHECK(cudaMalloc(&g_tab, (size_t)npos * half * sizeof(float2)));
    const size_t n = (size_t)npos * half;
    rope_table_kernel<<<(unsigned int)((n + 255) / 256), 256, 0, shlm_cuda_stream()>>>(
        g_tab, npos, half, head_dim, (double)theta);
    CUDA_CHECK_LAST();
    g_tab_npos = npos;
    g_tab_hd = head_dim;
    g_tab_theta = theta;
    return g_tab;
}

extern "C" const void *shlm_cuda_rope_table(int npos, int head_dim, float theta) {
    if (npos <= 0) SHLM_FATAL("rope table: %d positions", npos);
    if (head_dim <= 0 || head_dim % 2 != 0) SHLM_FATAL("rope: head_dim %d is not even", head_dim);
    return rope_table(npos, head_dim, theta);
}

extern "C" void shlm_cuda_rope(void *x, int N, int T, int stride, int n_heads, int head_dim,
                               float theta, int inverse) {
    if (N <= 0 || T <= 0 || n_heads <= 0) return;
    if (head_dim <= 0 || head_dim % 2 != 0) SHLM_FATAL("rope: head_dim %d is not even", head_dim);
    const int half = head_dim / 2;
    const int npos = N < T ? N : T; /* row i is at position i % T */
    const float2 *tab = rope_table(npos, head_dim, theta);
    const float sign = inverse ? -1.0f : 1.0f;
    cudaStream_t s = shlm_cuda_stream();
    const size_t cap = (size_t)shlm_cuda_sm_count() * 32;
    if (half % 8 == 0 && stride % 8 == 0 && shlm_aligned(x, 16)) {
        size_t work = (size_t)N * n_heads * (half / 8);
        rope_kernel<8><<<shlm_cuda_blocks(work, 256, cap), 256, 0, s>>>(
            (bf16 *)x, tab, N, T, stride, n_heads, half, sign);
    } else {
        size_t work = (size_t)N * n_heads * half;
        rope_kernel<1><<<shlm_cuda_blocks(work, 256, cap), 256, 0, s>>>(
            (bf16 *)x, tab, N, T, stride, n_heads, half, sign);
    }
    CUDA_CHECK_LAST();
}
