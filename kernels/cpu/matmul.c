/* cpu backend linear layer without bias, Hugging Face weight layout (OC,C): forward
 * y = x·Wᵀ and the two backward products, all by OpenBLAS sgemm. */
#include "kernels/cpu/cpu.h"

#include <cblas.h>
#include <string.h>

void shlm_cpu_matmul_fwd(void *out, const void *inp, const void *weight, int N, int C, int OC,
                         int accumulate) {
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) {
        /* an empty sum: BLAS would be handed lda = 0, which it rejects */
        if (!accumulate) memset(out, 0, (size_t)N * OC * sizeof(float));
        return;
    }
    /* out(N,OC) = inp(N,C) · weight(OC,C)ᵀ (+ out): beta = 1 fuses the residual add */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C,
                accumulate ? 1.0f : 0.0f, out, OC);
}

void shlm_cpu_matmul_bwd(void *dinp, float *dweight, const void *dout, const void *inp,
                         const void *weight, int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0) return; /* every product is empty or adds zero */
    /* dinp(N,C) += dout(N,OC) · weight(OC,C) */
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight,
                    C, 1.0f, dinp, C);
    /* dweight(OC,C) += dout(N,OC)ᵀ · inp(N,C) */
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                    1.0f, dweight, C);
}
