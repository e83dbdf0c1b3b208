/* cpu backend token embedding: forward row gather from wte (V,C), backward scatter-add
 * of the output gradient into dwte. */
#include "kernels/cpu/cpu.h"

#include <string.h>

/* Columns per task of the backward: threads own disjoint column blocks, so repeated
 * tokens never race and each dwte element sums its rows in token order, whatever the
 * thread count. 64 floats = four cache lines. */
enum { EMB_COL_BLOCK = 64 };

void shlm_cpu_embedding_fwd(void *out_, const int32_t *tokens, const void *wte_, int N, int C) {
    float *out = out_;
    const float *wte = wte_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        memcpy(out + (size_t)i * C, wte + (size_t)tokens[i] * C, (size_t)C * sizeof(float));
}

void shlm_cpu_embedding_bwd(float *dwte, const void *dout_, const int32_t *tokens, int N, int C) {
    const float *dout = dout_;
    int nblocks = (C + EMB_COL_BLOCK - 1) / EMB_COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int cb = 0; cb < nblocks; cb++) {
        int c0 = cb * EMB_COL_BLOCK;
        int c1 = c0 + EMB_COL_BLOCK < C ? c0 + EMB_COL_BLOCK : C;
        for (int i = 0; i < N; i++) {
            float *dst = dwte + (size_t)tokens[i] * C;
            const float *src = dout + (size_t)i * C;
            for (int c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}
