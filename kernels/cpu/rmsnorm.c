/* cpu backend RMSNorm: out = x / sqrt(mean(x²) + eps) * weight, and its backward into
 * the input gradient (+=) and the weight gradient (+=). */
#include "kernels/cpu/cpu.h"

#include <math.h>

/* Columns per task of the weight-gradient pass (see embedding.c for why by columns). */
enum { RMS_COL_BLOCK = 64 };

void shlm_cpu_rmsnorm_fwd(void *out_, float *rstd, const void *inp_, const void *weight_, int N,
                          int C, float eps, float *amax) {
    float *out = out_;
    const float *inp = inp_, *weight = weight_;
    float m = amax ? *amax : 0.0f;
#pragma omp parallel for schedule(static) reduction(max : m)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        /* the mean of squares in double: C reaches 8192, and rstd feeds the backward */
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / C + (double)eps));
        for (int c = 0; c < C; c++) {
            y[c] = x[c] * r * weight[c];
            m = fmaxf(m, fabsf(y[c])); /* NaN ignored */
        }
        rstd[i] = r;
    }
    if (amax) *amax = m;
}

void shlm_cpu_rmsnorm_bwd(void *dinp_, float *dweight, const void *dout_, const void *inp_,
                          const void *weight_, const float *rstd, int N, int C) {
    float *dinp = dinp_;
    const float *dout = dout_, *inp = inp_, *weight = weight_;

    /* dweight[c] += Σ_i dout[i,c] · inp[i,c] · rstd[i]; done first, so that dinp may
     * alias dout */
    int nblocks = (C + RMS_COL_BLOCK - 1) / RMS_COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int cb = 0; cb < nblocks; cb++) {
        int c0 = cb * RMS_COL_BLOCK;
        int c1 = c0 + RMS_COL_BLOCK < C ? c0 + RMS_COL_BLOCK : C;
        double acc[RMS_COL_BLOCK] = {0};
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
            double r = rstd[i];
            for (int c = c0; c < c1; c++) acc[c - c0] += (double)dy[c] * x[c] * r;
        }
        for (int c = c0; c < c1; c++) dweight[c] += (float)acc[c - c0];
    }

    /* dx = r·w·dy − r³/C · x · Σ_c dy_c w_c x_c (differentiating r through mean(x²)) */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        double dot = 0.0;
        for (int c = 0; c < C; c++) dot += (double)dy[c] * weight[c] * x[c];
        float r = rstd[i];
        float k = (float)((double)r * r * r * dot / C);
        for (int c = 0; c < C; c++) dx[c] += r * weight[c] * dy[c] - k * x[c];
    }
}
