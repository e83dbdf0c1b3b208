/* cpu backend optimizer and reductions over flat fp32 buffers: fused AdamW with
 * decoupled weight decay (the host AdamW, host_adamw.h), the sum of squares (for the
 * gradient norm) and accumulation. */
#include "kernels/cpu/cpu.h"

#include <math.h>

#include "kernels/host_adamw.h"

/* The host AdamW itself: the optimizer offload runs the same function, so the two agree
 * bit for bit by construction. */
void shlm_cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                    int step, float *amax) {
    host_adamw(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step, amax, NULL);
}

/* Fixed block boundaries (a function of n only) and a sequential sum of the block
 * partials make the result bit-identical for any thread count: the gradient norm, and
 * so clipping, must not depend on how many threads a rank runs. */
enum { SS_MAX_BLOCKS = 1024, SS_MIN_BLOCK = 4096 };

double shlm_cpu_sum_squares(const float *x, size_t n) {
    if (n == 0) return 0.0;
    size_t bs = (n + SS_MAX_BLOCKS - 1) / SS_MAX_BLOCKS;
    if (bs < SS_MIN_BLOCK) bs = SS_MIN_BLOCK;
    const int nb = (int)((n + bs - 1) / bs);
    double part[SS_MAX_BLOCKS];
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nb; blk++) {
        size_t i0 = (size_t)blk * bs, i1 = i0 + bs < n ? i0 + bs : n;
        double s = 0.0;
        for (size_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        part[blk] = s;
    }
    double total = 0.0;
    for (int blk = 0; blk < nb; blk++) total += part[blk];
    return total;
}

void shlm_cpu_accumulate(float *y, const float *x, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}
