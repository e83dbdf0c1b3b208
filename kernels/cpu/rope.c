/* cpu backend rotary position embedding, Hugging Face rotate-half layout: element i of
 * a head pairs with element i + hd/2, rotated by pos · rope->freq[i]. */
#include "kernels/cpu/cpu.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/check.h"

void shlm_cpu_rope(void *x_, int N, int T, int stride, int n_heads, const shlm_rope *rope,
                   const int32_t *pos0, int inverse) {
    float *x = x_;
    if (N <= 0 || T <= 0 || n_heads <= 0) return;
    const int head_dim = rope->head_dim;
    if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > SHLM_ROPE_MAX_HEAD_DIM)
        SHLM_FATAL("rope: head_dim %d is not an even width up to %d", head_dim,
                   SHLM_ROPE_MAX_HEAD_DIM);
    if (pos0 && N % T != 0) SHLM_FATAL("rope: %d rows are not whole sequences of %d", N, T);
    const int half = head_dim / 2;
    /* one cos/sin row per distinct position: positions 0..T-1 shared by every sequence
     * without pos0, one run of T per sequence with it (row r uses entry slot(r)) */
    const int nseq = pos0 ? N / T : 1;
    const int npos = pos0 ? T : (N < T ? N : T);
    for (int s = 0; pos0 && s < nseq; s++)
        if (pos0[s] < 0 || pos0[s] > INT_MAX - T)
            SHLM_FATAL("rope: pos0[%d] = %d is not a position (need 0 <= it <= %d)", s,
                       (int)pos0[s], INT_MAX - T);

    /* cos/sin of every (position, frequency), computed once in double: the angle
     * pos·freq reaches thousands of radians, where an fp32 angle loses ~1e-4 of it */
    const size_t nslots = (size_t)nseq * npos;
    float *cs = malloc(nslots * half * 2 * sizeof(float));
    SHLM_CHECK_ALLOC(cs);
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nslots; k++) {
        const int p = (pos0 ? pos0[k / npos] : 0) + (int)(k % npos);
        for (int i = 0; i < half; i++) {
            double angle = (double)p * rope->freq[i];
            cs[(k * half + i) * 2] = (float)cos(angle);
            /* the inverse rotation is the same one by -angle: only the sine flips */
            cs[(k * half + i) * 2 + 1] = (float)(inverse ? -sin(angle) : sin(angle));
        }
    }

#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
        const size_t slot = pos0 ? (size_t)r : (size_t)(r % T);
        const float *tab = cs + slot * half * 2;
        float *row = x + (size_t)r * stride;
        for (int h = 0; h < n_heads; h++) {
            float *lo = row + (size_t)h * head_dim, *hi = lo + half;
            for (int i = 0; i < half; i++) {
                float c = tab[2 * i], s = tab[2 * i + 1];
                float a = lo[i], b = hi[i];
                lo[i] = a * c - b * s;
                hi[i] = b * c + a * s;
            }
        }
    }
    free(cs);
}
