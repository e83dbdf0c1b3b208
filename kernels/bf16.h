/* bf16 on the host, usable by any code (the cpu backend's emulation, the NF4 quantizer,
 * converters): fp32 -> bf16 rounds to nearest, ties to even; NaN stays a (quiet) NaN of the
 * same sign; finite values beyond the bf16 range round to +-inf, as IEEE rounding does. */
#ifndef SHLM_BF16_H
#define SHLM_BF16_H

#include <stdint.h>
#include <string.h>

/* Inline: the host AdamW rounds its device copy element by element with it. */
static inline uint16_t shlm_f32_to_bf16(float x) {
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

static inline float shlm_bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
