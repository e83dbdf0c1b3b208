/* cpu backend dtype conversion: fp32 <-> bf16 with round-to-nearest-even, and the
 * in-place bf16 rounding that emulates bf16 collectives on fp32 storage. */
#include "kernels/cpu/cpu.h"

#include <string.h>

uint16_t shlm_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    /* NaN: truncating could clear every mantissa bit that survives and turn it into inf;
     * keep sign and top payload bits and set the quiet bit instead */
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    /* adding 0x7FFF plus the lowest kept bit rounds ties to even; a carry out of the
     * mantissa bumps the exponent, which is the correct rounding (up to inf at the top) */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float shlm_bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

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
