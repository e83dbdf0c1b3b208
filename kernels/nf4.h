/* NF4, QLoRA's 4-bit storage of frozen base weights, byte for byte as bitsandbytes 0.50.2
 * makes it: the format, its two code books, and the host quantizer that makes it at load time
 * (a pure function, the same on every backend). nf4_dequantize (kernels/ops.h) reads it back. */
#ifndef SHLM_KERNELS_NF4_H
#define SHLM_KERNELS_NF4_H

#include <stddef.h>
#include <stdint.h>

/*
 * The format of one tensor of n values (its flat, row-major order), that of
 * bitsandbytes.functional.quantize_4bit(x, blocksize=64, quant_type="nf4",
 * compress_statistics=False or True) on the CPU, field for field:
 *
 *   blocks        value i is in block b = i / 64; nb = ceil(n / 64) blocks, the last one
 *                 partial (n - 64·(nb - 1) values) when 64 does not divide n.
 *   codes         ceil(n / 2) bytes: c_i, the 4-bit index of value i into shlm_nf4_code (the
 *                 16 NormalFloat levels, ascending), in byte i / 2, value 2k in the HIGH nibble
 *                 and value 2k + 1 in the LOW nibble (byte k = c_2k << 4 | c_2k+1); an odd n
 *                 pads the last low nibble with 7 (the code of 0). bitsandbytes' packed
 *                 tensor (uint8, shape [ceil(n/2), 1]) holds these bytes.
 *   plain         absmax: nb fp32, block b's largest |x| (a partial last block's at least
 *                 1e-38, bitsandbytes' clamp, kept there and not in full blocks).
 *   double quant  the absmaxes quantized again (bitsandbytes' nested statistics): offset, one
 *                 fp32, their mean; absmax_codes: nb bytes, indices into shlm_nf4_dq_code (the
 *                 8-bit dynamic map), in groups of 256 blocks; absmax2: ceil(nb / 256) fp32, a
 *                 group's largest |absmax - offset|. Block b's scale is then
 *                 absmax_b = fp32(fp32(shlm_nf4_dq_code[absmax_codes[b]] · absmax2[b / 256])
 *                 + offset), a product and a sum each rounded to fp32 (never fused).
 *   value         x̂_i = fp32(shlm_nf4_code[c_i] · absmax_b), what dequantize_4bit gives in
 *                 fp32 (bf16: that, rounded to nearest even).
 *
 * Bytes a value, what an all-gather of NF4 shards moves: 1/2 for the codes (a quarter of
 * bf16's 2) plus 4/64 for plain absmaxes (0.5625 in all), or 1/64 + 4/(64·256) with double
 * quant (0.5159 in all) and 4 bytes a tensor for the offset.
 */
enum {
    SHLM_NF4_BLOCK = 64,    /* values per absmax */
    SHLM_NF4_DQ_GROUP = 256 /* absmaxes per absmax2 (double quant) */
};

/* One NF4 tensor: n values and the arrays above, in host memory (the quantizer's output) or
 * in a backend's (nf4_dequantize's input), each array from the tensor's first value. Plain:
 * absmax set, the other three NULL. Double quant: absmax NULL, absmax_codes, absmax2 and
 * offset set. */
typedef struct shlm_nf4 {
    size_t n;
    uint8_t *codes;        /* (n+1)/2 */
    float *absmax;         /* (nb): plain only */
    uint8_t *absmax_codes; /* (nb): double quant */
    float *absmax2;        /* (ceil(nb/256)): double quant */
    float *offset;         /* (1): double quant */
} shlm_nf4;

/* The 16 NF4 levels (bitsandbytes' get_4bit_type("nf4"): normal quantiles scaled to -1 .. 1,
 * 0 at index 7) and the 256 of the 8-bit dynamic map (create_dynamic_map(), ascending). */
extern const float shlm_nf4_code[16];
extern const float shlm_nf4_dq_code[256];

/* The arrays' lengths for n values. */
static inline size_t shlm_nf4_code_bytes(size_t n) { return n / 2 + n % 2; }
static inline size_t shlm_nf4_blocks(size_t n) { return n / SHLM_NF4_BLOCK + (n % SHLM_NF4_BLOCK != 0); }
static inline size_t shlm_nf4_groups(size_t n) {
    const size_t nb = shlm_nf4_blocks(n);
    return nb / SHLM_NF4_DQ_GROUP + (nb % SHLM_NF4_DQ_GROUP != 0);
}
/* Bytes of the scales of n values: nb fp32, or nb codes, the absmax2s and the offset. */
static inline size_t shlm_nf4_scale_bytes(size_t n, int double_quant) {
    return double_quant ? shlm_nf4_blocks(n) + 4 * shlm_nf4_groups(n) + 4
                        : 4 * shlm_nf4_blocks(n);
}

/* Quantizes the q->n values of x (fp32; bf16 bits with _bf16) into q's host arrays, bit for
 * bit what bitsandbytes 0.50.2's quantize_4bit(x, blocksize=64, quant_type="nf4",
 * compress_statistics=(q->absmax == NULL)) returns on the CPU (nf4.c says how, rounding by
 * rounding); the offset's mean is summed in the order torch's 8-lane CPU kernels use
 * (nf4.c). Deterministic for any thread count. Returns 0; or -1 when a value is NaN or
 * infinite (nothing to scale it by), *bad then its index (the first) and q's arrays
 * unspecified. */
int shlm_nf4_quantize(const shlm_nf4 *q, const float *x, size_t *bad);
int shlm_nf4_quantize_bf16(const shlm_nf4 *q, const uint16_t *x, size_t *bad);

#endif
