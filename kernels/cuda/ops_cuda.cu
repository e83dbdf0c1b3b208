/* The cuda compute backend's ops table (Hopper: bf16 activations on tensor cores, fp32
 * accumulation, cuBLASLt GEMMs); its members are the C launchers of kernels/cuda/. */
#include "kernels/cuda/cuda_common.cuh"

extern "C" {
#include "kernels/ops.h"
}

/* Designated initialisers in declaration order (what C++ accepts). act tensors are
 * bf16; weight gradients, master weights, moments, losses, rstd and lse are fp32, as
 * ops.h's conventions say. */
extern "C" void shlm_cuda_init(const shlm_ops_options *o) {
    shlm_cuda_attention_set_sm90(o->attention == SHLM_ATTENTION_SM90);
    /* the matmul library's handles now (the device is bound): the memory they take is
     * library state, in use before a run reads what is free for its plan */
    shlm_cuda_matmul_handles();
}

extern "C" const shlm_ops shlm_ops_cuda = {
    .name = "cuda",
    .act_dtype = SHLM_BF16,
    .available = shlm_cuda_available,
    .init = shlm_cuda_init,
    .device_count = shlm_cuda_device_count,
    .set_device = shlm_cuda_set_device,
    .mem_info = shlm_cuda_mem_info,
    .device_info = shlm_cuda_device_info,
    .device_check = shlm_cuda_device_check,
    .reserve = shlm_cuda_reserve,
    .scratch_bytes = shlm_cuda_step_scratch_bytes,
    .scratch_reserve = shlm_cuda_scratch_reserve,
    .range_push = shlm_cuda_range_push,
    .range_pop = shlm_cuda_range_pop,

    .alloc = shlm_cuda_alloc,
    .free = shlm_cuda_free,
    .alloc_align = SHLM_CUDA_ALLOC_ALIGN,
    .zero = shlm_cuda_zero,
    .copy = shlm_cuda_copy,
    .to_device = shlm_cuda_to_device,
    .to_host = shlm_cuda_to_host,
    .sync = shlm_cuda_sync,
    .host_alloc = shlm_cuda_host_alloc,
    .host_free = shlm_cuda_host_free,
    .to_host_async = shlm_cuda_to_host_async,
    .to_host_wait = shlm_cuda_to_host_wait,
    .to_device_async = shlm_cuda_to_device_async,
    .to_device_wait = shlm_cuda_to_device_wait,
    .graph_begin = shlm_cuda_graph_begin,
    .graph_end = shlm_cuda_graph_end,
    .graph_launch = shlm_cuda_graph_launch,
    .graph_free = shlm_cuda_graph_free,

    .f32_to_act = shlm_cuda_f32_to_act,
    .round_to_bf16 = shlm_cuda_round_to_bf16,
    .f32_to_bf16 = shlm_cuda_f32_to_bf16,
    .bf16_to_f32 = shlm_cuda_bf16_to_f32,
    .accumulate = shlm_cuda_accumulate,

    .embedding_fwd = shlm_cuda_embedding_fwd,
    .embedding_bwd = shlm_cuda_embedding_bwd,
    .rmsnorm_fwd = shlm_cuda_rmsnorm_fwd,
    .rmsnorm_bwd = shlm_cuda_rmsnorm_bwd,
    .matmul_fwd = shlm_cuda_matmul_fwd,
    .matmul_bwd = shlm_cuda_matmul_bwd,
    .bias_add = shlm_cuda_bias_add,
    .bias_grad = shlm_cuda_bias_grad,
    .scale = shlm_cuda_scale,
    .dropout = shlm_cuda_dropout,
    .copy2d = shlm_cuda_copy2d,
    .f32_add2d = shlm_cuda_f32_add2d,
    .row_dot = shlm_cuda_row_dot,
    .col_dot = shlm_cuda_col_dot,
    .dora_scale = shlm_cuda_dora_scale,
    .rope = shlm_cuda_rope,
    .attention_fwd = shlm_cuda_attention_fwd,
    .attention_bwd = shlm_cuda_attention_bwd,
    .kv_append = shlm_cuda_kv_append,
    .attention_decode = shlm_cuda_attention_decode,
    .swiglu_fwd = shlm_cuda_swiglu_fwd,
    .swiglu_bwd = shlm_cuda_swiglu_bwd,
    .xent_fwd_bwd = shlm_cuda_xent_fwd_bwd,

    .fp8_check = shlm_cuda_fp8_check,
    .fp8_quantize = shlm_cuda_fp8_quantize,
    .fp8_quantize_both = shlm_cuda_fp8_quantize_both,
    .fp8_param_amax = shlm_cuda_fp8_param_amax,
    .fp8_param_scale = shlm_cuda_fp8_param_scale,
    .fp8_param_cast = shlm_cuda_fp8_param_cast,
    .fp8_transpose = shlm_cuda_fp8_transpose,
    .matmul_fp8 = shlm_cuda_matmul_fp8,

    .nf4_dequantize = shlm_cuda_nf4_dequantize,

    .adamw = shlm_cuda_adamw,
    .sum_squares = shlm_cuda_sum_squares,
};
