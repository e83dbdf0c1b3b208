/* cpu backend NF4 dequantization (kernels/ops.h "NF4"): a region of an NF4 tensor back to
 * fp32, value = level · block absmax, one rounding, as bitsandbytes' dequantize_4bit. */
#include "kernels/cpu/cpu.h"

#include "kernels/check.h"

/* block b's absmax; with double quant the product is stored before the sum so that the
 * compiler cannot fuse the two into one rounding (kernels/nf4.h rounds each) */
static float block_absmax(const shlm_nf4 *q, size_t b) {
    if (q->absmax) return q->absmax[b];
    volatile float p = shlm_nf4_dq_code[q->absmax_codes[b]] * q->absmax2[b / SHLM_NF4_DQ_GROUP];
    return p + *q->offset;
}

void shlm_cpu_nf4_dequantize(void *out, const shlm_nf4 *q, size_t begin, size_t end) {
    if (begin % SHLM_NF4_BLOCK || begin > end || end > q->n)
        SHLM_FATAL("nf4_dequantize: values [%zu, %zu) of a tensor of %zu: the region must start "
                   "on a block of %d and lie inside the tensor", begin, end, q->n, SHLM_NF4_BLOCK);
    float *o = out;
    const size_t b0 = begin / SHLM_NF4_BLOCK, b1 = shlm_nf4_blocks(end);
#pragma omp parallel for schedule(static)
    for (size_t b = b0; b < b1; b++) {
        const float a = block_absmax(q, b);
        const size_t lo = b * SHLM_NF4_BLOCK;
        const size_t hi = end - lo < SHLM_NF4_BLOCK ? end : lo + SHLM_NF4_BLOCK;
        for (size_t i = lo; i < hi; i++) {
            const uint8_t byte = q->codes[i / 2];
            o[i - begin] = shlm_nf4_code[i % 2 ? byte & 15 : byte >> 4] * a;
        }
    }
}
