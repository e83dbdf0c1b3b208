/* cuda backend rotary position embedding, Hugging Face rotate-half layout, in place on
 * the first n_heads heads of every row: element i pairs with i + hd/2 (cpu: rope.c). */
#include "kernels/cuda/cuda_common.cuh"

#include <string.h>

/* ------------------------------------------------------------------ kernels */

/* cos/sin of the angle p·freq, formed and evaluated in double as the cpu backend does
 * (the angle reaches thousands of radians, where an fp32 angle loses ~1e-4 of it), then
 * rounded to fp32: the table and the kernel's own evaluation (rows given pos0) run this one
 * function, so a position gets the same bits either way. */
__device__ __forceinline__ float2 rope_cos_sin(int p, double freq) {
    double s, c;
    sincos((double)p * freq, &s, &c);
    return make_float2((float)c, (float)s);
}

/* The table of positions 0..npos-1: (cos, sin) at [p·half + f] */
__global__ void rope_table_kernel(float2 *tab, const double *freq, int npos, int half) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)npos * half) return;
    tab[i] = rope_cos_sin((int)(i / half), freq[i % half]);
}

/* One thread per (row, head, group of PAIRS frequency pairs): it loads PAIRS elements of
 * the lower half and PAIRS of the upper half (16 bytes each when PAIRS = 8). Rows of
 * sequences that start at position 0 (pos0 NULL) read the table; rows given pos0 (a
 * decode step's few new tokens, at positions no table bound is known for on the host)
 * evaluate their cos/sin themselves. The inverse rotation only flips the sine. */
template <int PAIRS>
__global__ void rope_kernel(bf16 *x, const float2 *tab, const double *freq, const int32_t *pos0,
                            int N, int T, int stride, int n_heads, int half, float sign) {
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
        float2 cs[PAIRS];
        if (pos0) {
            const int p = pos0[r / T] + r % T;
#pragma unroll
            for (int i = 0; i < PAIRS; i++) cs[i] = rope_cos_sin(p, freq[g * PAIRS + i]);
        } else {
            const float2 *t = tab + (size_t)(r % T) * half + g * PAIRS;
#pragma unroll
            for (int i = 0; i < PAIRS; i++) cs[i] = t[i];
        }
        if (PAIRS == 8) {
            float a[8], b[8];
            load_bf16x8(a, lo);
            load_bf16x8(b, hi);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float s = sign * cs[i].y, c = cs[i].x;
                const float ai = a[i], bi = b[i];
                a[i] = ai * c - bi * s;
                b[i] = bi * c + ai * s;
            }
            store_bf16x8(lo, a);
            store_bf16x8(hi, b);
        } else {
#pragma unroll
            for (int i = 0; i < PAIRS; i++) {
                const float s = sign * cs[i].y, c = cs[i].x;
                const float ai = __bfloat162float(lo[i]), bi = __bfloat162float(hi[i]);
                lo[i] = __float2bfloat16_rn(ai * c - bi * s);
                hi[i] = __float2bfloat16_rn(bi * c + ai * s);
            }
        }
    }
}

/* ------------------------------------------------------------------ launchers */

/* The description the device copies were made from (head_dim and freq compared), its
 * frequencies on the device, and the table of g_tab_npos positions. */
static shlm_rope g_rope;
static double *g_freq;
static float2 *g_tab;
static int g_tab_npos;

static void check_rope(const shlm_rope *rope) {
    if (rope->head_dim <= 0 || rope->head_dim % 2 != 0 ||
        rope->head_dim > SHLM_ROPE_MAX_HEAD_DIM)
        SHLM_FATAL("rope: head_dim %d is not an even width up to %d", rope->head_dim,
                   SHLM_ROPE_MAX_HEAD_DIM);
}

/* Makes the device frequencies those of rope (a new description drops the table). */
static void use_rope(const shlm_rope *rope) {
    const int half = rope->head_dim / 2;
    if (g_freq && rope->head_dim == g_rope.head_dim &&
        memcmp(rope->freq, g_rope.freq, (size_t)half * sizeof(double)) == 0)
        return;
    if (!g_freq) CUDA_CHECK(cudaMalloc(&g_freq, sizeof g_rope.freq));
    g_rope = *rope;
    /* queued behind the kernels that read the old frequencies; the copy is staged from
     * g_rope before this returns */
    CUDA_CHECK(cudaMemcpyAsync(g_freq, g_rope.freq, (size_t)half * sizeof(double),
                               cudaMemcpyHostToDevice, shlm_cuda_stream()));
    g_tab_npos = 0;
}

static const float2 *rope_table(const shlm_rope *rope, int npos) {
    use_rope(rope);
    if (g_tab && npos <= g_tab_npos) return g_tab;
    const int half = rope->head_dim / 2;
    /* cudaFree waits for kernels still reading the old table */
    CUDA_CHECK(cudaFree(g_tab));
    g_tab = NULL;
    CUDA_CHECK(cudaMalloc(&g_tab, (size_t)npos * half * sizeof(float2)));
    const size_t n = (size_t)npos * half;
    rope_table_kernel<<<(unsigned int)((n + 255) / 256), 256, 0, shlm_cuda_stream()>>>(
        g_tab, g_freq, npos, half);
    CUDA_CHECK_LAST();
    g_tab_npos = npos;
    return g_tab;
}

extern "C" const void *shlm_cuda_rope_table(const shlm_rope *rope, int npos) {
    if (npos <= 0) SHLM_FATAL("rope table: %d positions", npos);
    check_rope(rope);
    return rope_table(rope, npos);
}

extern "C" void shlm_cuda_rope(void *x, int N, int T, int stride, int n_heads,
                               const shlm_rope *rope, const int32_t *pos0, int inverse) {
    if (N <= 0 || T <= 0 || n_heads <= 0) return;
    check_rope(rope);
    if (pos0 && N % T != 0) SHLM_FATAL("rope: %d rows are not whole sequences of %d", N, T);
    const int half = rope->head_dim / 2;
    const float2 *tab = NULL;
    if (pos0) use_rope(rope);
    else tab = rope_table(rope, N < T ? N : T); /* row i is at position i % T */
    const float sign = inverse ? -1.0f : 1.0f;
    cudaStream_t s = shlm_cuda_stream();
    const size_t cap = (size_t)shlm_cuda_sm_count() * 32;
    if (half % 8 == 0 && stride % 8 == 0 && shlm_aligned(x, 16)) {
        size_t work = (size_t)N * n_heads * (half / 8);
        rope_kernel<8><<<shlm_cuda_blocks(work, 256, cap), 256, 0, s>>>(
            (bf16 *)x, tab, g_freq, pos0, N, T, stride, n_heads, half, sign);
    } else {
        size_t work = (size_t)N * n_heads * half;
        rope_kernel<1><<<shlm_cuda_blocks(work, 256, cap), 256, 0, s>>>(
            (bf16 *)x, tab, g_freq, pos0, N, T, stride, n_heads, half, sign);
    }
    CUDA_CHECK_LAST();
}
