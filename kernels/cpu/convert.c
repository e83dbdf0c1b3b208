/* cpu backend dtype conversion: fp32 <-> act (a copy: act is fp32 here), and the in-place
 * bf16 rounding that emulates bf16 collectives on fp32 storage (kernels/bf16.h). */
#include "kernels/cpu/cpu.h"

#include <string.h>

/* act is fp32 on the cpu backend, so both directions are copies */
void shlm_cpu_f32_to_act(void *act, const float *f32, size_t n) {
    if (n && act != (const void *)f32) memmove(act, f32, n * sizeof(float));
}

void shlm_cpu_round_to_bf16(float *x, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = shlm_bf16_to_f32(shlm_f32_to_bf16(x[i]));
}

void shlm_cpu_f32_to_bf16(uint16_t *bf16, const float *f32, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) bf16[i] = shlm_f32_to_bf16(f32[i]);
}

void shlm_cpu_bf16_to_f32(float *f32, const uint16_t *bf16, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) f32[i] = shlm_bf16_to_f32(bf16[i]);
}
