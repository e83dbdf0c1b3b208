/* cpu backend softmax cross-entropy: per-row loss and, in the same pass, the logits'
 * gradient (softmax − onehot) · dscale, which may overwrite the logits. */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <string.h>

#include "kernels/check.h"

void shlm_cpu_xent_fwd_bwd(float *losses, void *dlogits_, const void *logits_,
                           const int32_t *targets, int N, int V, float dscale) {
    float *dlogits = dlogits_;
    const float *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        float *dx = dlogits ? dlogits + (size_t)i * V : NULL;
        const int32_t tgt = targets[i];
        if (tgt >= V)
            SHLM_FATAL("xent: target %d of row %d is outside the vocabulary (%d)", tgt, i, V);
        if (tgt < 0) { /* ignored row: no loss and no gradient */
            losses[i] = 0.0f;
            if (dx) memset(dx, 0, (size_t)V * sizeof(float));
            continue;
        }
        /* subtract the row max so exp() cannot overflow; sum in double so that the
         * logsumexp of a 32000-wide row keeps fp32 precision */
        float mx = -INFINITY;
        for (int j = 0; j < V; j++)
            if (x[j] > mx) mx = x[j];
        const float xt = x[tgt]; /* read before dx (which may be x) is written */
        double sum = 0.0;
        if (dx) {
            /* one exp per logit: keep exp(x - max) in dx and normalise it below */
            for (int j = 0; j < V; j++) {
                float e = expf(x[j] - mx);
                dx[j] = e;
                sum += e;
            }
        } else {
            for (int j = 0; j < V; j++) sum += expf(x[j] - mx);
        }
        losses[i] = (float)((double)mx + log(sum) - xt);
        if (dx) {
            const float k = (float)(dscale / sum);
            for (int j = 0; j < V; j++) dx[j] *= k;
            dx[tgt] -= dscale;
        }
    }
}
