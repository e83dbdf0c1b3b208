/* cpu backend rotary position embedding, Hugging Face rotate-half layout: element i of
 * a head pairs with element i + hd/2, rotated by pos · theta^(-2i/hd). */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/check.h"

void shlm_cpu_rope(void *x_, int N, int T, int stride, int n_heads, int head_dim, float theta,
                   int inverse) {
    float *x = x_;
    if (N <= 0 || T <= 0 || n_heads <= 0) return;
    if (head_dim <= 0 || head_dim % 2 != 0) SHLM_FATAL("rope: head_dim %d is not even", head_dim);
    int half = head_dim / 2;
    int npos = N < T ? N : T; /* row i is at position i % T */

    /* cos/sin of every (position, frequency), computed once in double: the angle
     * pos·freq reaches thousands of radians, where an fp32 angle loses ~1e-4 of it */
    float *cs = malloc((size_t)npos * half * 2 * sizeof(float));
    SHLM_CHECK_ALLOC(cs);
#pragma omp parallel for schedule(static)
    for (int p = 0; p < npos; p++) {
        for (int i = 0; i < half; i++) {
            double freq = pow((double)theta, -2.0 * i / head_dim);
            double angle = (double)p * freq;
            cs[((size_t)p * half + i) * 2] = (float)cos(angle);
            /* the inverse rotation is the same one by -angle: only the sine flips */
            cs[((size_t)p * half + i) * 2 + 1] = (float)(inverse ? -sin(angle) : sin(angle));
        }
    }

#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
        const float *tab = cs + (size_t)(r % T) * half * 2;
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
