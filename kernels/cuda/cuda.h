/* The cuda backend's C launchers: the members of shlm_ops_cuda under their own names,
 * in the cpu backend's argument order (kernels/cpu/cpu.h), callable from C and CUDA. */
#ifndef SHLM_KERNELS_CUDA_H
#define SHLM_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/ops.h" /* a C header without its own extern "C" */

/* The one stream every op of this backend is queued on (a cudaStream_t, created on
 * first use on the current device, non-blocking so that it never waits for the legacy
 * default stream). The NCCL comm backend and the benchmarks order their own work
 * against it with events. */
void *shlm_cuda_stream_handle(void);

/* ---- devices and memory (memory.cu); see kernels/ops.h for each member's contract ---- */
int shlm_cuda_available(void);
int shlm_cuda_device_count(void); /* 0 when there is no driver or no GPU */
/* cudaSetDevice; must come before the first op (the stream belongs to one device) */
void shlm_cuda_set_device(int device);
/* NVTX ranges for Nsight Systems */
void shlm_cuda_range_push(const char *name);
void shlm_cuda_range_pop(void);
/* device memory in use and total (cudaMemGetInfo); 0 on success */
int shlm_cuda_mem_info(size_t *used, size_t *total);
int shlm_cuda_device_info(shlm_device_info *out);
/* ops.h device_check: whether the bound device can load this build's portable kernels */
int shlm_cuda_device_check(char *why, size_t whylen);
/* ops.h init: cuda.attention */
void shlm_cuda_init(const shlm_ops_options *o);
/* device allocations are carved from the arena in multiples of this many bytes */
enum { SHLM_CUDA_ALLOC_ALIGN = 256 };
void *shlm_cuda_alloc(size_t bytes);
/* one device allocation that later allocs are carved from (see ops.h reserve) */
int shlm_cuda_reserve(size_t bytes); /* zeroed, 256-byte aligned, ready on every stream */
void shlm_cuda_free(void *p);
void shlm_cuda_zero(void *p, size_t bytes);
/* dst == src is a no-op (an in-place all-gather copies a shard onto its own slot);
 * otherwise the ranges must not overlap */
void shlm_cuda_copy(void *dst, const void *src, size_t bytes);
/* returns once host_src may be reused (synchronises the stream) */
void shlm_cuda_to_device(void *dst, const void *host_src, size_t bytes);
void shlm_cuda_to_host(void *host_dst, const void *src, size_t bytes); /* synchronises */
void shlm_cuda_sync(void);
void *shlm_cuda_host_alloc(size_t bytes);                      /* pinned; NULL when refused */
void shlm_cuda_host_free(void *p);
void shlm_cuda_to_host_async(void *host_dst, const void *src, size_t bytes); /* side stream */
void shlm_cuda_to_host_wait(void);
void shlm_cuda_to_device_async(void *dst, const void *host_src, size_t bytes); /* side stream */
void shlm_cuda_to_device_wait(void);
/* out(N, OC) = inp(N, C)·Wᵀ (+ residual, which may be out) for a few rows, bf16 (gemv.cu):
 * 1 when queued; 0 (nothing queued) unless 1 <= N <= SHLM_GEMV_MAX_ROWS, C a multiple of 8
 * and inp and weight 16-byte aligned */
enum { SHLM_GEMV_MAX_ROWS = 8 };
int shlm_cuda_gemv(void *out, const void *inp, const void *weight, int N, int C, int OC,
                   const void *residual);
/* Recording the backend stream's work as a graph (ops.h graph_begin .. graph_free;
 * graph.cu) */
void shlm_cuda_graph_begin(void);
void *shlm_cuda_graph_end(void);
void shlm_cuda_graph_launch(void *graph);
void shlm_cuda_graph_free(void *graph);
/* Called about every 0.2 ms while the host waits for the stream (sync, copies to and
 * from the host, sum_squares): the NCCL comm backend runs its watchdog there, so a
 * stream stuck behind a collective that never finishes ends the job instead of hanging
 * the host. NULL (the default): plain cudaStreamSynchronize. */
void shlm_cuda_set_host_wait_hook(void (*hook)(void));
/* The largest scratch a training step's ops request (ops.h scratch_bytes), and
 * allocating it ahead (scratch_reserve). */
size_t shlm_cuda_step_scratch_bytes(int B, int T, int dim, int n_heads, int n_kv_heads,
                                    int head_dim);
void shlm_cuda_scratch_reserve(size_t bytes);
/* attention_bwd's scratch at this shape (D and the dS tiles of one pass) */
size_t shlm_cuda_attention_bwd_scratch(int B, int T, int nh, int nkv, int hd);
/* cuBLASLt's handles and workspace, made ahead of the first product */
void shlm_cuda_matmul_handles(void);
void shlm_cuda_matmul_init(void);
size_t shlm_cuda_matmul_workspace_bytes(void);
/* rmsnorm_bwd's and sum_squares' scratch */
size_t shlm_cuda_rmsnorm_bwd_scratch(int N, int C);
size_t shlm_cuda_sum_squares_scratch(void);

/* ---- conversion (convert.cu); act is bf16 on this backend, rounding as the cpu
 * backend's shlm_f32_to_bf16 (nearest-even, NaN stays a quiet NaN of the same sign) ---- */
void shlm_cuda_f32_to_act(void *act, const float *f32, size_t n);
void shlm_cuda_round_to_bf16(float *x, size_t n);
/* the casts of bf16 collectives: the same two conversions with explicit types */
void shlm_cuda_f32_to_bf16(uint16_t *bf16, const float *f32, size_t n);
void shlm_cuda_bf16_to_f32(float *f32, const uint16_t *bf16, size_t n);

/* ---- layers; shapes and semantics as in kernels/ops.h ---- */
void shlm_cuda_embedding_fwd(void *out, const int32_t *tokens, const void *wte, int N, int C);
/* deterministic: every dwte element sums its rows in token order, no float atomics */
void shlm_cuda_embedding_bwd(float *dwte, const void *dout, const int32_t *tokens, int N, int C);

void shlm_cuda_rmsnorm_fwd(void *out, float *rstd, const void *inp, const void *weight, int N,
                           int C, float eps, float *amax);
/* dinp may alias dout; dweight is summed in a fixed order (deterministic) */
void shlm_cuda_rmsnorm_bwd(void *dinp, float *dweight, const void *dout, const void *inp,
                           const void *weight, const float *rstd, int N, int C);

/* cuBLASLt, bf16 operands, fp32 accumulation. A residual (bf16) is the GEMM's C input:
 * added in fp32 and rounded to bf16 once (the residual stream lives in bf16). */
void shlm_cuda_matmul_fwd(void *out, const void *inp, const void *weight, int N, int C, int OC,
                          const void *residual);
/* dinp (bf16) and dweight (fp32) += or = (flags), bf16 operands */
void shlm_cuda_matmul_bwd(void *dinp, float *dweight, const void *dout, const void *inp,
                          const void *weight, int N, int C, int OC, int flags);

void shlm_cuda_bias_add(void *x, const void *bias, int N, int C);
/* Deterministic: each column's rows summed by a fixed set of threads in a fixed order. */
void shlm_cuda_bias_grad(float *dbias, const void *dout, int N, int C, int set);

void shlm_cuda_scale(void *x, size_t n, float a);
void shlm_cuda_dropout(void *out, const void *x, int N, int T, int C, float p,
                       const uint64_t *row_keys, uint64_t salt, int add);
void shlm_cuda_copy2d(void *dst, size_t dld, const void *src, size_t sld, int rows, int cols);
void shlm_cuda_f32_add2d(float *dst, size_t dld, const float *src, size_t sld, int rows, int cols,
                         int set);
/* Deterministic: one warp a row, its lanes' partial sums added in a fixed tree order. */
void shlm_cuda_row_dot(float *out, const void *a, const void *b, int rows, int cols, float coef,
                       int add);
/* Deterministic: each column's rows summed by a fixed set of threads in a fixed order. */
void shlm_cuda_col_dot(float *out, const void *a, const void *b, int ld, const float *n2, int N,
                       int C, int set);
void shlm_cuda_dora_scale(void *out, const void *x, const void *residual, int ld, const void *m,
                          const float *n2, int N, int C);

/* rope->head_dim must be even (aborts otherwise). Keeps one copy of the last description
 * it was given (rope_freq.h) on the device, with its table; a different one replaces them. */
void shlm_cuda_rope(void *x, int N, int T, int stride, int n_heads, const shlm_rope *rope,
                    const int32_t *pos0, int inverse);
/* rope's device table for positions 0..npos-1: float2 (cos, sin) of the angle
 * pos·rope->freq[f] at [pos·(head_dim/2) + f], computed in double, 256-byte aligned (typed
 * void for C; a const float2 * in CUDA). Built on the first call for this description or
 * for more positions, then kept: valid until a rope call or this one is given another
 * description or asks for more positions (the rebuild waits for queued kernels that read
 * the old one). For kernels that fuse the rotation (the attention backward's Hopper
 * epilogues). */
const void *shlm_cuda_rope_table(const shlm_rope *rope, int npos);

/* Flash attention on tensor cores; any head_dim up to 128; nh must be a multiple of nkv
 * (aborts otherwise). Deterministic (no atomics): every output row has one writer summing
 * in a fixed order. Two implementations of the same contract: the Hopper wgmma kernels
 * (attention_sm90.cu, attention_bwd_sm90.cu: head_dim 64 and 128 on a compute capability
 * 9.0 device, tried first) and the portable mma.sync kernels of attention.cu, the declared
 * fallback, which run wherever a Hopper kernel declines. The backward's give the same bits
 * either way; the forward's agree to bf16 rounding. doc_start (ops.h; device memory):
 * every kernel skips the key tiles wholly before its rows' documents and masks the rest
 * element by element (attention_doc.cuh); NULL runs the plain causal kernels. */
void shlm_cuda_attention_fwd(void *out, float *lse, const void *qkv, const int32_t *doc_start,
                             int B, int T, int nh, int nkv, int hd);
/* rope non-NULL (ops.h): dq, dk w.r.t. the pre-RoPE q, k; the wgmma kernels rotate their
 * fp32 accumulators before the store (one rounding), a pass whose dK/dV or dQ ran on the
 * mma.sync kernels gets shlm_cuda_rope(inverse) on those rows afterwards. */
void shlm_cuda_attention_bwd(void *dqkv, const void *dout, const void *qkv, const void *out,
                             const float *lse, const int32_t *doc_start, int B, int T, int nh,
                             int nkv, int hd, const shlm_rope *rope);
/* Which implementation later attention calls try first: enable 1 the Hopper kernels (the
 * default), 0 the mma.sync fallback alone. The backend's init sets it from
 * cuda.attention; tests and benchmarks, which run both, set it themselves. */
void shlm_cuda_attention_set_sm90(int enable);
/* What the last forward and the last backward ran: SHLM_ATTN_RAN_SM90_FWD when the forward
 * ran the Hopper kernel, _DKV / _DQ when every pass of the backward's dK/dV / dQ did. */
enum { SHLM_ATTN_RAN_SM90_FWD = 1, SHLM_ATTN_RAN_SM90_DKV = 2, SHLM_ATTN_RAN_SM90_DQ = 4 };
unsigned shlm_cuda_attention_sm90_ran(void);
/* The forward on Hopper warpgroup MMA (attention_sm90.cu): head_dim 64 or 128,
 * 16-byte-aligned qkv and out, a compute capability 9.0 device and a build with its
 * sm_90a code. Returns 0 when it queued the work, 1 when it did not (the caller then runs
 * attention.cu's kernel). */
int shlm_cuda_attention_fwd_sm90(void *out, float *lse, const void *qkv,
                                 const int32_t *doc_start, int B, int T, int nh, int nkv, int hd);
/* 1 when the sm_90a kernels of attention_sm90.cu and attention_bwd_sm90.cu can run here
 * (compute capability 9.0, sm_90a image in the binary; probed once per process). */
int shlm_cuda_sm90_usable(void);
/* The backward's dK/dV (+dS) pass on Hopper warpgroup MMA (attention_bwd_sm90.cu), same
 * contract as attention.cu's attn_bwd_dkv_kernel for batch elements b0..b0+nb-1 of one
 * pass (ds_head, scale, scale_log2, doc_start as there): head_dim 64 or 128, 16-byte-aligned
 * pointers, a compute capability 9.0 device and its sm_90a code; 0 queued, 1 declined
 * (nothing queued). rope: NULL, or shlm_cuda_rope_table(description, npos >= T): the dk rows
 * are stored inverse-rotated (w.r.t. the pre-RoPE k, key position t of row b·T + t),
 * rotated in fp32 before the one rounding to bf16; dv and the dS tiles are the same
 * either way. */
int shlm_cuda_attention_bwd_dkv_sm90(void *dqkv, void *dS, size_t ds_head, const void *dout,
                                     const void *qkv, const float *lse, const float *D,
                                     const int32_t *doc_start, int b0, int nb, int T, int nh,
                                     int nkv, int hd, float scale, float scale_log2,
                                     const void *rope);
/* The backward's dQ pass on wgmma (attention_bwd_sm90.cu): dq rows of batch elements
 * b0..b0+nb-1 from the dS tiles the dK/dV pass (either kernel) wrote; same conditions and
 * return value as the dK/dV one. rope: as for dK/dV, on the dq rows (query positions). */
int shlm_cuda_attention_bwd_dq_sm90(void *dqkv, const void *dS, size_t ds_head, const void *qkv,
                                    const int32_t *doc_start, int b0, int nb, int T, int nh,
                                    int nkv, int hd, const void *rope);

/* The KV cache (ops.h; attention_decode.cu): bf16 cache, hd up to 128. The decode splits
 * the cache length over blocks by the shape and cap alone (never pos: nothing is read back
 * to the host) and merges the splits' partial softmaxes in a second kernel, through the
 * backend's scratch; deterministic. A row whose pos breaks ops.h's bounds is left alone and
 * its out is NaN. */
void shlm_cuda_kv_append(void *k_cache, void *v_cache, const void *qkv, const int32_t *pos,
                         int B, int Tn, int cap, int nh, int nkv, int hd);
void shlm_cuda_attention_decode(void *out, void *k_cache, void *v_cache, const void *qkv,
                                const int32_t *pos, int B, int Tn, int cap, int nh, int nkv,
                                int hd);

void shlm_cuda_swiglu_fwd(void *out, const void *gu, int N, int F, float *amax);
/* dgu may alias gu */
void shlm_cuda_swiglu_bwd(void *dgu, const void *dout, const void *gu, int N, int F,
                          float *amax);

/* A target >= V cannot abort from the device: its row's loss is NaN (so the step's
 * loss shows it) and its gradient row is zero. */
void shlm_cuda_xent_fwd_bwd(float *losses, void *dlogits, const void *logits,
                            const int32_t *targets, int N, int V, float dscale);

/* ---- FP8 matmul (fp8.cu); see kernels/ops.h for each member's contract ---- */
/* 0 on compute capability 8.9 or 9.x with a cuBLASLt that has FP8 matmuls */
int shlm_cuda_fp8_check(char *why, size_t whylen);
/* src bf16; device-side scales only (no host synchronisation): amax and cast are kernels
 * queued on the stream; q->scale_inv holds the amax between them */
void shlm_cuda_fp8_quantize(const shlm_fp8_matrix *q, const void *src, int transpose);
void shlm_cuda_fp8_quantize_both(const shlm_fp8_matrix *q, const shlm_fp8_matrix *q_t,
                                 const void *src, const float *src_amax);
/* p, amax, scale_inv and codes in device memory, at any element offset; amax as the bits
 * of a non-negative float (atomicMax), so the caller zeroes it (+0.0f) before the first
 * fp8_param_amax. Kernels on the stream, no host synchronisation. */
void shlm_cuda_fp8_param_amax(float *amax, const float *p, size_t n);
void shlm_cuda_fp8_param_scale(float *scale_inv, const float *amax, int round_bf16);
void shlm_cuda_fp8_param_cast(uint8_t *codes, const float *p, size_t n, const float *amax,
                              int round_bf16);
/* 128 x 128-byte tiles through shared memory, 16-byte loads and stores where rows and cols
 * are multiples of 16 and the pointers 16-byte aligned; any shape and alignment works */
void shlm_cuda_fp8_transpose(uint8_t *dst, const uint8_t *src, int rows, int cols);
/* cuBLASLt's FP8 TN product (scale pointers: SCALAR_32F tensorwise, OUTER_VEC_32F
 * rowwise; fp32 accumulation) where its layout rules allow (K and N multiples of 16, every
 * pointer 16-byte aligned) and it offers an algorithm; the declared fallback kernel
 * (decoded codes, fp32 sums; slow) otherwise. out bf16 or fp32 (flags), c like out;
 * SHLM_FP8_FAST_ACCUM asks cuBLASLt for CUBLASLT_MATMUL_DESC_FAST_ACCUM (no periodic
 * promotion of the tensor cores' partial sums to fp32) on bf16 outputs. */
void shlm_cuda_matmul_fp8(void *out, int flags, const shlm_fp8_matrix *a,
                          const shlm_fp8_matrix *b, const void *c);
/* What the last matmul_fp8 ran (for tests and benchmarks). */
enum { SHLM_FP8_RAN_CUBLASLT = 1, SHLM_FP8_RAN_FALLBACK = 2 };
unsigned shlm_cuda_fp8_matmul_ran(void);

/* ---- NF4 (nf4.cu) ---- */
/* bf16 out; 16-byte code loads and out stores where codes + begin/2 and out are 16-byte
 * aligned, a code byte at a time otherwise; kernels on the stream */
void shlm_cuda_nf4_dequantize(void *out, const shlm_nf4 *q, size_t begin, size_t end);

/* ---- optimizer and reductions (adamw.cu) ---- */
/* Bit-identical to the cpu backend's (same operation order, no fused multiply-adds).
 * Aborts when step < 1. */
void shlm_cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                     int step, float *amax);
/* Deterministic: fixed blocks (a function of n only) summed in a fixed order. */
double shlm_cuda_sum_squares(const float *x, size_t n);
/* y[i] += x[i] */
void shlm_cuda_accumulate(float *y, const float *x, size_t n);

#ifdef __cplusplus
}
#endif

#endif
