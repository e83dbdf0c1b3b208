/* The FP8 linear layer of fp8_linear.h: quantize both operands of each GEMM into the two
 * buffers, then one matmul_fp8. */
#include "src/model/fp8_linear.h"

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

fp8_linear_sizes fp8_linear_sizes_for(size_t N, size_t max_width, size_t max_weight,
                                      size_t max_in) {
    fp8_linear_sizes s;
    s.a_codes = N * max_width;
    s.a_scales = max_sz(N, max_width);
    s.b_codes = max_sz(max_weight, N * max_in);
    s.b_scales = max_width;
    s.t_codes = N * max_width;
    s.t_scales = max_width;
    return s;
}

int fp8_linear_ops_ok(const shlm_ops *ops) {
    return ops->fp8_check && ops->fp8_quantize && ops->fp8_quantize_both && ops->matmul_fp8 &&
           ops->fp8_param_amax && ops->fp8_param_scale && ops->fp8_param_cast &&
           ops->fp8_transpose;
}

int fp8_linear_recipe(model_matmul matmul, shlm_fp8_scaling *scaling, shlm_fp8_format *grad) {
    switch (matmul) {
    case MODEL_MATMUL_FP8_TENSORWISE:
        *scaling = SHLM_FP8_TENSORWISE;
        *grad = SHLM_FP8_E5M2;
        return 0;
    case MODEL_MATMUL_FP8_ROWWISE:
        *scaling = SHLM_FP8_ROWWISE;
        *grad = SHLM_FP8_E4M3;
        return 0;
    default: return -1;
    }
}

enum side { SIDE_A, SIDE_B, SIDE_T };

/* rows x cols of format fmt over one of the buffers (not yet quantized) */
static shlm_fp8_matrix matrix(const fp8_linear *f, enum side side, int rows, int cols,
                              shlm_fp8_format fmt) {
    uint8_t *const codes[] = {f->a_codes, f->b_codes, f->t_codes};
    float *const scales[] = {f->a_scales, f->b_scales, f->t_scales};
    return (shlm_fp8_matrix){codes[side], scales[side], rows, cols, fmt, f->scaling};
}

/* an operand quantized from src (transpose: src is cols x rows) */
static shlm_fp8_matrix operand(const fp8_linear *f, enum side side, int rows, int cols,
                               shlm_fp8_format fmt, const void *src, int transpose) {
    const shlm_fp8_matrix q = matrix(f, side, rows, cols, fmt);
    f->ops->fp8_quantize(&q, src, transpose);
    return q;
}

void fp8_linear_fwd(const fp8_linear *f, void *out, const void *inp, fp8_linear_weight w, int N,
                    int C, int OC, const void *residual, const shlm_fp8_matrix *keep_t,
                    const float *inp_amax) {
    const shlm_fp8_matrix a = keep_t ? matrix(f, SIDE_A, N, C, SHLM_FP8_E4M3)
                                     : operand(f, SIDE_A, N, C, SHLM_FP8_E4M3, inp, 0);
    if (keep_t) f->ops->fp8_quantize_both(&a, keep_t, inp, inp_amax);
    const shlm_fp8_matrix b = w.w8 ? *w.w8 : operand(f, SIDE_B, OC, C, SHLM_FP8_E4M3, w.w, 0);
    f->ops->matmul_fp8(out, f->fast_accum ? SHLM_FP8_FAST_ACCUM : 0, &a, &b, residual);
}

/* q(wᵀ) (C x OC) in b's buffer: the made codes transposed under their scale, or quantized */
static shlm_fp8_matrix weight_t(const fp8_linear *f, fp8_linear_weight w, int C, int OC) {
    if (!w.w8) return operand(f, SIDE_B, C, OC, SHLM_FP8_E4M3, w.w, 1);
    shlm_fp8_matrix t = matrix(f, SIDE_B, C, OC, SHLM_FP8_E4M3);
    f->ops->fp8_transpose(t.codes, w.w8->codes, OC, C);
    t.scale_inv = w.w8->scale_inv;
    return t;
}

void fp8_linear_bwd(const fp8_linear *f, void *dinp, float *dweight, const void *dout,
                    const void *inp, const shlm_fp8_matrix *inp_t, fp8_linear_weight w, int N,
                    int C, int OC, int flags, const float *dout_amax) {
    const shlm_fp8_matrix dy = matrix(f, SIDE_A, N, OC, f->grad_format);
    const shlm_fp8_matrix dy_t = matrix(f, SIDE_T, OC, N, f->grad_format);
    if (dinp && dweight) f->ops->fp8_quantize_both(&dy, &dy_t, dout, dout_amax);
    else if (dinp) f->ops->fp8_quantize(&dy, dout, 0);
    else if (dweight) f->ops->fp8_quantize(&dy_t, dout, 1);
    if (dinp) {
        const shlm_fp8_matrix b = weight_t(f, w, C, OC);
        f->ops->matmul_fp8(dinp, 0, &dy, &b, flags & SHLM_MM_SET_DINP ? NULL : dinp);
    }
    if (dweight) {
        const shlm_fp8_matrix b = inp_t ? *inp_t : operand(f, SIDE_B, C, N, SHLM_FP8_E4M3, inp, 1);
        f->ops->matmul_fp8(dweight, SHLM_FP8_OUT_F32, &dy_t, &b,
                           flags & SHLM_MM_SET_DWEIGHT ? NULL : dweight);
    }
}
