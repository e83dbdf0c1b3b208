/* cpu backend ops of LoRA's adapters (kernels/ops.h "LoRA"): scaling, the seeded dropout,
 * sub-matrix copies, and DoRA's row and column dot products and scale (fp32 activations).
 * Every sum runs in a fixed order: the same bits for any thread count. */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <string.h>

#include "kernels/dropout_mask.h"

void shlm_cpu_scale(void *x_, size_t n, float a) {
    float *x = x_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= a;
}

void shlm_cpu_dropout(void *out_, const void *x_, int N, int T, int C, float p,
                      const uint64_t *row_keys, uint64_t salt, int add) {
    float *out = out_;
    const float *x = x_;
    const uint32_t thr = shlm_dropout_threshold(p);
    const float k = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const uint64_t key = row_keys[i / T], first = (uint64_t)(i % T) * (uint64_t)C;
        const float *xr = x + (size_t)i * C;
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) {
            const float v = shlm_dropout_keep(key, salt, first + (uint64_t)c, thr) ? xr[c] * k : 0.0f;
            o[c] = add ? o[c] + v : v;
        }
    }
}

void shlm_cpu_copy2d(void *dst, size_t dld, const void *src, size_t sld, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        memcpy((float *)dst + (size_t)i * dld, (const float *)src + (size_t)i * sld,
               (size_t)cols * sizeof(float));
}

void shlm_cpu_f32_add2d(float *dst, size_t dld, const float *src, size_t sld, int rows, int cols,
                        int set) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; i++) {
        float *d = dst + (size_t)i * dld;
        const float *s = src + (size_t)i * sld;
        for (int c = 0; c < cols; c++) d[c] = set ? s[c] : d[c] + s[c];
    }
}

void shlm_cpu_row_dot(float *out, const void *a_, const void *b_, int rows, int cols, float coef,
                      int add) {
    const float *a = a_, *b = b_;
#pragma omp parallel for schedule(static)
    for (int j = 0; j < rows; j++) {
        const float *ar = a + (size_t)j * cols, *br = b + (size_t)j * cols;
        float s = 0.0f;
        for (int c = 0; c < cols; c++) s += ar[c] * br[c];
        out[j] = add ? out[j] + coef * s : coef * s;
    }
}

/* Columns in fixed blocks among threads, each summed over the rows in row order. */
enum { COL_DOT_BLOCK = 256 };

void shlm_cpu_col_dot(float *out, const void *a_, const void *b_, int ld, const float *n2, int N,
                      int C, int set) {
    const float *a = a_, *b = b_;
    const int n_tasks = (C + COL_DOT_BLOCK - 1) / COL_DOT_BLOCK;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n_tasks; t++) {
        const int c0 = t * COL_DOT_BLOCK, c1 = c0 + COL_DOT_BLOCK < C ? c0 + COL_DOT_BLOCK : C;
        float acc[COL_DOT_BLOCK] = {0};
        for (int i = 0; i < N; i++) {
            const float *ar = a + (size_t)i * ld, *br = b + (size_t)i * ld;
            for (int c = c0; c < c1; c++) acc[c - c0] += ar[c] * br[c];
        }
        for (int c = c0; c < c1; c++) {
            const float v = acc[c - c0] / sqrtf(n2[c]);
            out[c] = set ? v : out[c] + v;
        }
    }
}

void shlm_cpu_dora_scale(void *out_, const void *x_, const void *residual_, int ld,
                         const void *m_, const float *n2, int N, int C) {
    float *out = out_;
    const float *x = x_, *res = residual_, *m = m_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const size_t r = (size_t)i * ld;
        for (int c = 0; c < C; c++) {
            const float g = m[c] / sqrtf(n2[c]);
            out[r + c] = (res ? res[r + c] : 0.0f) + g * x[r + c];
        }
    }
}
