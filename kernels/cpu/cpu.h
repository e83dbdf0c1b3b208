/* The cpu backend's functions (reference C with OpenMP and OpenBLAS): the members of
 * shlm_ops_cpu under their own names, plus bf16 helpers that other host code may use. */
#ifndef SHLM_KERNELS_CPU_H
#define SHLM_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
#include "kernels/ops.h"

/* Sets the OpenMP and the OpenBLAS thread counts of this process (n >= 1). Each MPI
 * rank calls it once at start-up so that ranks sharing a node do not oversubscribe. */
void shlm_cpu_set_threads(int n);

/* ---- memory (memory.c) ---- */
int shlm_cpu_available(void);
void *shlm_cpu_alloc(size_t bytes); /* zeroed, 64-byte aligned */
void shlm_cpu_free(void *p);
size_t shlm_cpu_allocated_bytes(void); /* live bytes of shlm_cpu_alloc, as requested */
void shlm_cpu_zero(void *p, size_t bytes);
void shlm_cpu_copy(void *dst, const void *src, size_t bytes);
void shlm_cpu_to_device(void *dst, const void *host_src, size_t bytes);
void shlm_cpu_to_host(void *host_dst, const void *src, size_t bytes);
void shlm_cpu_sync(void);

/* ---- conversion (convert.c); act is fp32 on this backend ---- */
void shlm_cpu_f32_to_act(void *act, const float *f32, size_t n);
void shlm_cpu_round_to_bf16(float *x, size_t n);
void shlm_cpu_f32_to_bf16(uint16_t *bf16, const float *f32, size_t n);
void shlm_cpu_bf16_to_f32(float *f32, const uint16_t *bf16, size_t n);

/* ---- layers; shapes and semantics as in kernels/ops.h ---- */
void shlm_cpu_embedding_fwd(void *out, const int32_t *tokens, const void *wte, int N, int C);
void shlm_cpu_embedding_bwd(float *dwte, const void *dout, const int32_t *tokens, int N, int C);

void shlm_cpu_rmsnorm_fwd(void *out, float *rstd, const void *inp, const void *weight, int N,
                          int C, float eps, float *amax);
/* dinp may alias dout (every read of dout happens before the row's write). */
void shlm_cpu_rmsnorm_bwd(void *dinp, float *dweight, const void *dout, const void *inp,
                          const void *weight, const float *rstd, int N, int C);

void shlm_cpu_matmul_fwd(void *out, const void *inp, const void *weight, int N, int C, int OC,
                         const void *residual);
void shlm_cpu_matmul_bwd(void *dinp, float *dweight, const void *dout, const void *inp,
                         const void *weight, int N, int C, int OC, int flags);

void shlm_cpu_bias_add(void *x, const void *bias, int N, int C);
/* Deterministic for any thread count: each column summed over the rows in row order. */
void shlm_cpu_bias_grad(float *dbias, const void *dout, int N, int C, int set);

/* rope->head_dim must be even, pos0's values >= 0 and T must divide N with pos0 (aborts
 * otherwise). */
void shlm_cpu_rope(void *x, int N, int T, int stride, int n_heads, const shlm_rope *rope,
                   const int32_t *pos0, int inverse);

/* nh must be a multiple of nkv, doc_start (NULL or B·T values) as ops.h says (aborts
 * otherwise, naming the first bad value). Memory O(T) per thread: one score row at a
 * time, never a T×T matrix; a row visits only its document's keys. The backward
 * recomputes probabilities from lse, runs one task per (batch, kv head) so no two threads
 * write the same dk/dv, and requires that dqkv alias none of its inputs. */
void shlm_cpu_attention_fwd(void *out, float *lse, const void *qkv, const int32_t *doc_start,
                            int B, int T, int nh, int nkv, int hd);
/* rope non-NULL: then shlm_cpu_rope(dqkv, B·T, T, (nh+2·nkv)·hd, nh + nkv, rope, NULL, 1)
 * (ops.h) */
void shlm_cpu_attention_bwd(void *dqkv, const void *dout, const void *qkv, const void *out,
                            const float *lse, const int32_t *doc_start, int B, int T, int nh,
                            int nkv, int hd, const shlm_rope *rope);
/* The KV cache (ops.h): a pos[b] outside 0..cap-Tn aborts naming the row. The decode
 * computes each (row, head, new token) as the forward computes a query row (one thread,
 * memory O(cap)), so its out has the bits attention_fwd gives that token's row over the
 * same keys and values. */
void shlm_cpu_kv_append(void *k_cache, void *v_cache, const void *qkv, const int32_t *pos, int B,
                        int Tn, int cap, int nh, int nkv, int hd);
void shlm_cpu_attention_decode(void *out, void *k_cache, void *v_cache, const void *qkv,
                               const int32_t *pos, int B, int Tn, int cap, int nh, int nkv,
                               int hd);

void shlm_cpu_swiglu_fwd(void *out, const void *gu, int N, int F, float *amax);
/* dgu may alias gu (each gate/up pair is read before it is written). */
void shlm_cpu_swiglu_bwd(void *dgu, const void *dout, const void *gu, int N, int F,
                         float *amax);

/* Aborts on a target >= V. */
void shlm_cpu_xent_fwd_bwd(float *losses, void *dlogits, const void *logits,
                           const int32_t *targets, int N, int V, float dscale);

/* ---- FP8 emulation (fp8.c): codes and scales bit for bit as ops.h's rule says; the
 * GEMM sums the decoded values in fp32 through OpenBLAS. matmul_fp8 aborts when K or the
 * scalings of a and b differ, or both are E5M2. ---- */
int shlm_cpu_fp8_check(char *why, size_t whylen);
void shlm_cpu_fp8_quantize(const shlm_fp8_matrix *q, const void *src, int transpose);
void shlm_cpu_fp8_quantize_both(const shlm_fp8_matrix *q, const shlm_fp8_matrix *q_t,
                                const void *src, const float *src_amax);
void shlm_cpu_fp8_param_amax(float *amax, const float *p, size_t n);
void shlm_cpu_fp8_param_scale(float *scale_inv, const float *amax, int round_bf16);
void shlm_cpu_fp8_param_cast(uint8_t *codes, const float *p, size_t n, const float *amax,
                             int round_bf16);
void shlm_cpu_fp8_transpose(uint8_t *dst, const uint8_t *src, int rows, int cols);
void shlm_cpu_matmul_fp8(void *out, int flags, const shlm_fp8_matrix *a,
                         const shlm_fp8_matrix *b, const void *c);

/* ---- NF4 (nf4.c): kernels/nf4.h's values in fp32, blocks shared between threads ---- */
void shlm_cpu_nf4_dequantize(void *out, const shlm_nf4 *q, size_t begin, size_t end);

/* ---- optimizer and reductions (adamw.c) ---- */
/* Aborts when step < 1. */
void shlm_cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                    int step, float *amax);
/* Deterministic for any thread count: fixed blocks, summed in a fixed order. */
double shlm_cpu_sum_squares(const float *x, size_t n);
void shlm_cpu_accumulate(float *y, const float *x, size_t n);

#endif
