/* The cpu compute backend's ops table (reference C, OpenMP, OpenBLAS) and its thread
 * setting. Activations are fp32 here; bf16 collectives are emulated by round_to_bf16. */
#include "kernels/cpu/cpu.h"

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

void shlm_cpu_set_threads(int n) {
    if (n < 1) n = 1;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    /* OpenBLAS keeps its own pool (pthreads build) and does not follow omp_set_num_threads */
    openblas_set_num_threads(n);
}

const shlm_ops shlm_ops_cpu = {
    .name = "cpu",
    .act_dtype = SHLM_F32,
    .available = shlm_cpu_available,

    .alloc = shlm_cpu_alloc,
    .free = shlm_cpu_free,
    .allocated_bytes = shlm_cpu_allocated_bytes,
    .zero = shlm_cpu_zero,
    .copy = shlm_cpu_copy,
    .to_device = shlm_cpu_to_device,
    .to_host = shlm_cpu_to_host,
    .sync = shlm_cpu_sync,

    .f32_to_act = shlm_cpu_f32_to_act,
    .round_to_bf16 = shlm_cpu_round_to_bf16,
    .f32_to_bf16 = shlm_cpu_f32_to_bf16,
    .bf16_to_f32 = shlm_cpu_bf16_to_f32,
    .accumulate = shlm_cpu_accumulate,

    .embedding_fwd = shlm_cpu_embedding_fwd,
    .embedding_bwd = shlm_cpu_embedding_bwd,
    .rmsnorm_fwd = shlm_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = shlm_cpu_rmsnorm_bwd,
    .matmul_fwd = shlm_cpu_matmul_fwd,
    .matmul_bwd = shlm_cpu_matmul_bwd,
    .bias_add = shlm_cpu_bias_add,
    .bias_grad = shlm_cpu_bias_grad,
    .rope = shlm_cpu_rope,
    .attention_fwd = shlm_cpu_attention_fwd,
    .attention_bwd = shlm_cpu_attention_bwd,
    .kv_append = shlm_cpu_kv_append,
    .attention_decode = shlm_cpu_attention_decode,
    .swiglu_fwd = shlm_cpu_swiglu_fwd,
    .swiglu_bwd = shlm_cpu_swiglu_bwd,
    .xent_fwd_bwd = shlm_cpu_xent_fwd_bwd,

    .fp8_check = shlm_cpu_fp8_check,
    .fp8_quantize = shlm_cpu_fp8_quantize,
    .fp8_quantize_both = shlm_cpu_fp8_quantize_both,
    .fp8_param_amax = shlm_cpu_fp8_param_amax,
    .fp8_param_scale = shlm_cpu_fp8_param_scale,
    .fp8_param_cast = shlm_cpu_fp8_param_cast,
    .fp8_transpose = shlm_cpu_fp8_transpose,
    .matmul_fp8 = shlm_cpu_matmul_fp8,

    .nf4_dequantize = shlm_cpu_nf4_dequantize,

    .adamw = shlm_cpu_adamw,
    .sum_squares = shlm_cpu_sum_squares,
};
