/* A transformer block's linear layer y = x·Wᵀ through FP8 (train.matmul = fp8-tensorwise |
 * fp8-rowwise): every GEMM of it, forward, dgrad and wgrad, as kernels/ops.h's matmul_fp8
 * TN form over operands quantized dynamically (each from its own amax at that moment). */
#ifndef SHLM_FP8_LINEAR_H
#define SHLM_FP8_LINEAR_H

#include <stddef.h>

#include "kernels/ops.h"
#include "src/engine/model.h"

/* The recipe's formats and three operand buffers, reused by every GEMM in turn (the model
 * allocates them once, through ops->alloc, at the sizes fp8_linear_sizes gives). */
typedef struct fp8_linear {
    const shlm_ops *ops;
    shlm_fp8_scaling scaling;   /* tensorwise or rowwise (one scale per row of an operand) */
    shlm_fp8_format grad_format;/* the gradient operand's: E5M2 tensorwise (the range a
                                 * single scale cannot give), E4M3 rowwise (per-row scales
                                 * give it), as torchao's two recipes */
    uint8_t *a_codes, *b_codes; /* codes of a (the GEMM's M side) and b (its N side) */
    float *a_scales, *b_scales; /* their scale_inv */
    uint8_t *t_codes;           /* q(dyᵀ), made beside q(dy) from one pass over dy */
    float *t_scales;
    int fast_accum;             /* the forward products may sum at the tensor cores' reduced
                                 * precision (train.fp8_fast_accum); dgrad and wgrad never */
    float *src_amax;            /* tensorwise: one float, the amax an operand's producer
                                 * made as it wrote the operand (ops.h rmsnorm_fwd's amax);
                                 * NULL rowwise */
} fp8_linear;

/* What the operand buffers must hold for linears of at most `max_width` inputs or
 * outputs, `max_weight` weight elements and `max_in` inputs, over N token rows:
 * a holds q(x) (N x C), q(dy) (N x OC); b holds q(W) (OC x C), q(Wᵀ) (C x OC), q(xᵀ)
 * (C x N); t holds q(dyᵀ) (OC x N). Elements: codes are bytes, scales floats. */
typedef struct fp8_linear_sizes {
    size_t a_codes, a_scales, b_codes, b_scales, t_codes, t_scales;
} fp8_linear_sizes;
fp8_linear_sizes fp8_linear_sizes_for(size_t N, size_t max_width, size_t max_weight,
                                      size_t max_in);

/* 1 when ops has every FP8 member an FP8 recipe uses (the products, both quantizations, and
 * the weights the gather makes, fsdp.fp8_all_gather), else 0. */
int fp8_linear_ops_ok(const shlm_ops *ops);

/* The recipe's scaling and gradient format; 0, or -1 for bf16 (no FP8). */
int fp8_linear_recipe(model_matmul matmul, shlm_fp8_scaling *scaling, shlm_fp8_format *grad);

/* The weight of a linear: act-dtype w (OC x C) quantized in each product, or q(w) made
 * already (w8: OC x C, E4M3, tensorwise: model.h's fp8_weight), which the backward
 * transposes (the same codes, the same scale). */
typedef struct fp8_linear_weight {
    const void *w;
    const shlm_fp8_matrix *w8;
} fp8_linear_weight;

/* out(N,OC) = q(inp(N,C), E4M3) · q(w(OC,C), E4M3)ᵀ + residual: residual as matmul_fwd's
 * (NULL, separate, or aliasing out). keep_t: NULL, or a C x N matrix (codes and scales
 * the caller owns, E4M3, the recipe's scaling) that receives q(inpᵀ) for the backward, made
 * in the same pass over inp as q(inp). inp_amax: NULL, or (tensorwise) max |inp| as inp's
 * producer made it (f->src_amax): ops.h fp8_quantize_both's src_amax where keep_t is given,
 * ignored without it. */
void fp8_linear_fwd(const fp8_linear *f, void *out, const void *inp, fp8_linear_weight w, int N,
                    int C, int OC, const void *residual, const shlm_fp8_matrix *keep_t,
                    const float *inp_amax);
/* matmul_bwd's contract (dinp and dweight skipped when NULL, "+=" unless flags set them):
 * dinp(N,C) = q(dout, G) · q(wᵀ, E4M3)ᵀ; dweight(OC,C) = q(doutᵀ, G) · q(inpᵀ, E4M3)ᵀ in
 * fp32. inp_t: q(inpᵀ) as the forward kept it (C x N, E4M3, the recipe's scaling: the same
 * codes quantizing inp here would give), or NULL to quantize inp. With both products, q(dout)
 * and q(doutᵀ) come from one pass over dout; dout_amax: NULL, or (tensorwise) max |dout| as
 * dout's producer made it, used for that pass and ignored with one product. */
void fp8_linear_bwd(const fp8_linear *f, void *dinp, float *dweight, const void *dout,
                    const void *inp, const shlm_fp8_matrix *inp_t, fp8_linear_weight w, int N,
                    int C, int OC, int flags, const float *dout_amax);

#endif
