/* bf16 on the host, usable by any code (the cpu backend's emulation, the NF4 quantizer,
 * converters): fp32 -> bf16 rounds to nearest, ties to even; NaN stays a (quiet) NaN of the
 * same sign; finite values beyond the bf16 range round to +-inf, as IEEE rounding does. */
#ifndef SHLM_BF16_H
#define SHLM_BF16_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

uint16_t shlm_f32_to_bf16(float x);
float shlm_bf16_to_f32(uint16_t b);

#ifdef __cplusplus
}
#endif

#endif
