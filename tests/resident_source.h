/* A parameter source for model-only tests: every unit's fp32 parameters and gradients
 * resident in host memory, nothing gathered or reduced. The tests zero the gradients
 * themselves, so the model always adds into them (overwrite = 0). */
#ifndef SHLM_TESTS_RESIDENT_SOURCE_H
#define SHLM_TESTS_RESIDENT_SOURCE_H

#include <stdlib.h>

#include "src/model/decoder.h"

typedef struct resident {
    model_layout lay;
    float **params, **grads;
} resident;

static const void *resident_acquire(void *ctx, int u, model_phase ph) {
    (void)ph;
    return ((resident *)ctx)->params[u];
}
static void resident_release(void *ctx, int u, model_phase ph) { (void)ctx, (void)u, (void)ph; }
static float *resident_grad(void *ctx, int u, int *overwrite) {
    *overwrite = 0;
    return ((resident *)ctx)->grads[u];
}
static void resident_grad_ready(void *ctx, int u) { (void)ctx, (void)u; }

/* The source over r (its layout and arrays filled by the test). */
static inline model_param_source resident_source(resident *r) {
    return (model_param_source){.ctx = r, .acquire = resident_acquire, .release = resident_release,
                                .grad = resident_grad, .grad_ready = resident_grad_ready};
}

#endif
