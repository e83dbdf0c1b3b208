/* cpu backend linear layer without bias, Hugging Face weight layout (OC,C): forward
 * y = x·Wᵀ and the two backward products, by OpenBLAS sgemm (a one-row forward by sgemv). */
#include "kernels/cpu/cpu.h"

#include <cblas.h>
#include <string.h>

void shlm_cpu_matmul_fwd(void *out, const void *inp, const void *weight, int N, int C, int OC,
                         const void *residual) {
    if (N <= 0 || OC <= 0) return;
    const size_t n = (size_t)N * OC;
    /* out = residual first, so beta = 1 adds it inside the product (a no-op when it
     * aliases out) */
    if (residual && residual != out) memcpy(out, residual, n * sizeof(float));
    if (C <= 0) {
        /* an empty sum: BLAS would be handed lda = 0, which it rejects */
        if (!residual) memset(out, 0, n * sizeof(float));
        return;
    }
    /* out(N,OC) = inp(N,C) · weight(OC,C)ᵀ (+ out); one row (a decode step's) by sgemv,
     * which streams the weight once, where sgemm first packs it into a copy: for one row
     * the packing costs more than the product */
    if (N == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, C, 1.0f, weight, C, inp, 1,
                    residual ? 1.0f : 0.0f, out, 1);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C,
                residual ? 1.0f : 0.0f, out, OC);
}

void shlm_cpu_matmul_bwd(void *dinp, float *dweight, const void *dout, const void *inp,
                         const void *weight, int N, int C, int OC, int flags) {
    const float beta_x = (flags & SHLM_MM_SET_DINP) ? 0.0f : 1.0f;
    const float beta_w = (flags & SHLM_MM_SET_DWEIGHT) ? 0.0f : 1.0f;
    if (C <= 0) return; /* both outputs are empty */
    /* dinp(N,C) (+)= dout(N,OC) · weight(OC,C); an empty sum (OC = 0) adds nothing */
    if (dinp && N > 0) {
        if (OC > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC,
                        weight, C, beta_x, dinp, C);
        else if (beta_x == 0.0f)
            memset(dinp, 0, (size_t)N * C * sizeof(float));
    }
    /* dweight(OC,C) (+)= dout(N,OC)ᵀ · inp(N,C) */
    if (dweight && OC > 0) {
        if (N > 0)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                        beta_w, dweight, C);
        else if (beta_w == 0.0f)
            memset(dweight, 0, (size_t)OC * C * sizeof(float));
    }
}
