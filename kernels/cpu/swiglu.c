/* cpu backend SwiGLU: out = silu(gate) * up over rows of [gate | up] and its backward. */
#include "kernels/cpu/cpu.h"

#include <math.h>

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

void shlm_cpu_swiglu_fwd(void *out_, const void *gu_, int N, int F, float *amax) {
    float *out = out_;
    const float *gu = gu_;
    float m = amax ? *amax : 0.0f;
#pragma omp parallel for schedule(static) reduction(max : m)
    for (int i = 0; i < N; i++) {
        const float *g = gu + (size_t)i * 2 * F, *u = g + F;
        float *o = out + (size_t)i * F;
        for (int j = 0; j < F; j++) {
            o[j] = g[j] * sigmoidf(g[j]) * u[j];
            m = fmaxf(m, fabsf(o[j])); /* NaN ignored */
        }
    }
    if (amax) *amax = m;
}

void shlm_cpu_swiglu_bwd(void *dgu_, const void *dout_, const void *gu_, int N, int F,
                         float *amax) {
    float *dgu = dgu_;
    const float *dout = dout_, *gu = gu_;
    float m = amax ? *amax : 0.0f;
#pragma omp parallel for schedule(static) reduction(max : m)
    for (int i = 0; i < N; i++) {
        const float *g = gu + (size_t)i * 2 * F, *u = g + F;
        const float *dy = dout + (size_t)i * F;
        float *dg = dgu + (size_t)i * 2 * F, *du = dg + F;
        for (int j = 0; j < F; j++) {
            /* read both inputs first so that dgu may alias gu */
            float gj = g[j], uj = u[j], s = sigmoidf(gj);
            /* silu'(g) = σ(g)·(1 + g·(1 − σ(g))) */
            dg[j] = dy[j] * uj * s * (1.0f + gj * (1.0f - s));
            du[j] = dy[j] * gj * s;
            m = fmaxf(m, fmaxf(fabsf(dg[j]), fabsf(du[j]))); /* NaN ignored */
        }
    }
    if (amax) *amax = m;
}
