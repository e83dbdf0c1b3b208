/* cpu backend bias of a linear layer: the add after the product and its gradient, the sum
 * of the output gradient's rows (fp32 activations). */
#include "kernels/cpu/cpu.h"

void shlm_cpu_bias_add(void *x, const void *bias, int N, int C) {
    float *y = x;
    const float *b = bias;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = y + (size_t)i * C;
        for (int c = 0; c < C; c++) row[c] += b[c];
    }
}

/* Columns split among threads in fixed blocks; each column summed over the rows in row
 * order (rows outer, so the inner loop runs along a row's contiguous columns): the result
 * depends on (N, C) only, not on the thread count. */
enum { BIAS_COLS_PER_TASK = 256 };

void shlm_cpu_bias_grad(float *dbias, const void *dout, int N, int C, int set) {
    const float *g = dout;
    const int n_tasks = (C + BIAS_COLS_PER_TASK - 1) / BIAS_COLS_PER_TASK;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n_tasks; t++) {
        const int c0 = t * BIAS_COLS_PER_TASK;
        const int c1 = c0 + BIAS_COLS_PER_TASK < C ? c0 + BIAS_COLS_PER_TASK : C;
        float acc[BIAS_COLS_PER_TASK] = {0};
        for (int i = 0; i < N; i++) {
            const float *row = g + (size_t)i * C;
            for (int c = c0; c < c1; c++) acc[c - c0] += row[c];
        }
        for (int c = c0; c < c1; c++) dbias[c] = set ? acc[c - c0] : dbias[c] + acc[c - c0];
    }
}
