/* AdamW on host memory with SIMD (AVX-512, AVX2, chosen at run time; a portable scalar
 * loop otherwise), on all the process's OpenMP threads: the cpu backend's adamw op and the
 * engine's optimizer offload (src/engine/offload.h) both run it, so the two give the same
 * bits. Every instruction set gives the same bits as the scalar loop: the same operations
 * in the same order, no fused multiply-add, IEEE division and square root. */
#ifndef SHLM_HOST_ADAMW_H
#define SHLM_HOST_ADAMW_H

#include <stddef.h>
#include <stdint.h>

typedef enum host_adamw_isa {
    HOST_ADAMW_SCALAR = 0,
    HOST_ADAMW_AVX2,
    HOST_ADAMW_AVX512,
    HOST_ADAMW_N
} host_adamw_isa;

/* "scalar", "avx2", "avx512". */
const char *host_adamw_isa_name(host_adamw_isa isa);
/* 1 when this CPU (and this build's compiler) runs isa. */
int host_adamw_isa_supported(host_adamw_isa isa);
/* The widest supported: what host_adamw runs. */
host_adamw_isa host_adamw_isa_best(void);

/* One AdamW step (1-based `step`) over n elements, decoupled weight decay on the weight
 * before the update (torch.optim.AdamW):
 *   g = grad·grad_scale, m = β1·m + (1−β1)·g, v = β2·v + (1−β2)·g·g,
 *   param −= lr·(m·bc1 / (√(v·bc2) + eps) + weight_decay·param),
 * bc1 = 1/(1−β1^step), bc2 = 1/(1−β2^step) worked out in double, then rounded to fp32.
 * amax (or NULL): *amax = max(*amax, max |param_i|) over the updated weights, NaN ignored
 * (host_abs_max). copy (or NULL): the updated weights rounded to bf16 (shlm_f32_to_bf16),
 * written while they are in cache: the optimizer offload's device copy. Aborts when step < 1. */
void host_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                int step, float *amax, uint16_t *copy);
/* The same with a given instruction set (which must be supported), on the calling thread
 * alone, without amax: what the tests compare. */
void host_adamw_isa_run(host_adamw_isa isa, float *param, const float *grad, float *m, float *v,
                        size_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float grad_scale, int step, uint16_t *copy);

/* dst = src rounded to bf16 (shlm_f32_to_bf16's bits), with the widest instruction set, on
 * all the OpenMP threads. */
void host_bf16_copy(uint16_t *dst, const float *src, size_t n);

/* *amax = max(*amax, max |p_i|) over n, NaN ignored (the caller zeroes it first). */
void host_abs_max(float *amax, const float *p, size_t n);

#endif
