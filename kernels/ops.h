/* The compute-backend interface: one table of function pointers per backend
 * (cpu, cuda), chosen once at start-up by name. The model calls only these. */
#ifndef SHLM_OPS_H
#define SHLM_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/nf4.h"
#include "kernels/rope_freq.h"

/* Element types a backend may store tensors in. */
typedef enum shlm_dtype { SHLM_F32 = 0, SHLM_BF16 = 1 } shlm_dtype;

static inline size_t shlm_dtype_size(shlm_dtype t) { return t == SHLM_BF16 ? 2 : 4; }
const char *shlm_dtype_name(shlm_dtype t);

/*
 * Conventions (every member):
 * - All pointers are in the backend's memory (host for cpu, device for cuda).
 * - "act" tensors (activations and gathered parameters) are `void *` holding
 *   `act_dtype` elements: fp32 on the cpu backend, bf16 on cuda. Arithmetic
 *   accumulates in fp32 either way. Weight gradients, master weights, optimizer
 *   moments, losses, norms' rstd and attention's logsumexp are always fp32.
 * - Row-major. N = number of token rows (B*T). Linear weights use the Hugging Face
 *   layout (out_features, in_features): y = x · Wᵀ.
 * - "+=" in a comment means the op accumulates into its output (gradients sum over
 *   micro-batches and over the residual stream); "=" means it overwrites.
 * - Token ids are int32; a target < 0 is ignored by the loss.
 * - Ops are asynchronous on backends that have a stream; `sync` waits for them.
 */
/* matmul_bwd flags */
enum { SHLM_MM_SET_DINP = 1, SHLM_MM_SET_DWEIGHT = 2 };

/* Which attention kernels the cuda backend runs (cuda.attention): the Hopper wgmma kernels
 * where they apply, the portable mma.sync ones elsewhere; or the mma.sync ones alone. */
typedef enum shlm_attention_kernels {
    SHLM_ATTENTION_SM90 = 0,
    SHLM_ATTENTION_MMA_SYNC = 1
} shlm_attention_kernels;

/* ---- FP8 (OCP 8-bit floating point) ----
 * E4M3: 4 exponent bits, 3 mantissa bits, bias 7, finite only: largest 448, NaN 0x7F/0xFF.
 * E5M2: 5 exponent bits, 2 mantissa bits, bias 15, IEEE-like: largest 57344, ±inf, NaN.
 * Conversion to FP8 rounds to nearest even and saturates: a finite value (or ±inf) beyond
 * the largest becomes ±largest (cuda_fp8.h's __NV_SATFINITE), NaN stays NaN. */
typedef enum shlm_fp8_format { SHLM_FP8_E4M3 = 0, SHLM_FP8_E5M2 = 1 } shlm_fp8_format;

/* One scale for a whole matrix, or one per row (per token of an activation, per output
 * channel of a weight: the outer-vector scaling of cuBLASLt). */
typedef enum shlm_fp8_scaling { SHLM_FP8_TENSORWISE = 0, SHLM_FP8_ROWWISE = 1 } shlm_fp8_scaling;

/* matmul_fp8's flags */
enum { SHLM_FP8_OUT_F32 = 1, SHLM_FP8_FAST_ACCUM = 2 };

/* A quantized matrix of `rows` x `cols`, row-major: element (r, c) stands for
 * decode(codes[r·cols + c]) · scale_inv[rowwise ? r : 0]. codes and scale_inv are in the
 * backend's memory (rows·cols bytes; 1 or rows floats); the caller owns them. */
typedef struct shlm_fp8_matrix {
    uint8_t *codes;
    float *scale_inv;
    int rows, cols;
    shlm_fp8_format format;
    shlm_fp8_scaling scaling;
} shlm_fp8_matrix;

/* What a compute backend takes at start-up (init), from the job's [cuda] keys. */
typedef struct shlm_ops_options {
    shlm_attention_kernels attention;
} shlm_ops_options;

/* What ops->device_info reports. */
typedef struct shlm_device_info {
    char name[96];
    int cc_major, cc_minor;
    char pci_bus_id[32];
} shlm_device_info;

typedef struct shlm_ops {
    const char *name;      /* "cpu" or "cuda" */
    shlm_dtype act_dtype;  /* element type of every "act" tensor */
    /* 1 when the backend can run on this machine (cuda: a GPU is visible) */
    int (*available)(void);
    /* Optional (NULL: no options): applies o; called once at start-up, before any op. */
    void (*init)(const shlm_ops_options *o);
    /* Optional (NULL on cpu): devices visible to this process, and binding the process
     * to one of them before anything is allocated. */
    int (*device_count)(void);
    void (*set_device)(int device);
    /* Optional (NULL on cpu): device memory in use (all of this device, as the driver
     * reports it) and its total, in bytes. Returns 0 on success. */
    int (*mem_info)(size_t *used, size_t *total);
    /* Optional (NULL on cpu): the bound device's name as the driver reports it ("NVIDIA
     * H200"), compute capability and PCI bus id ("0000:19:00.0": NVML finds the same
     * device by it whatever CUDA_VISIBLE_DEVICES renumbered). Returns 0 on success. */
    int (*device_info)(shlm_device_info *out);
    /* Optional (NULL: the backend runs wherever it is available): 0 when this build's
     * kernels run on the bound device (set_device first), else -1 with one line in why
     * naming the device, its compute capability and what the build was compiled for. */
    int (*device_check)(char *why, size_t whylen);
    /* Optional (NULL on cpu): reserve one arena of `bytes` that every later alloc is
     * carved from, so nothing is allocated once training starts. Returns 0; aborts with
     * the numbers when the device cannot hold it. */
    int (*reserve)(size_t bytes);
    /* Optional (NULL on cpu): what the ops allocate for themselves outside the arena at
     * batches of up to B sequences of T tokens (the largest scratch any op asks for,
     * attention's backward dominating, and the matmul library's workspace), so the fit
     * check counts it; scratch_reserve(that) allocates it all before step 1. */
    size_t (*scratch_bytes)(int B, int T, int dim, int n_heads, int n_kv_heads, int head_dim);
    void (*scratch_reserve)(size_t bytes);
    /* Optional (NULL on cpu): open and close a named range on the profiler's timeline
     * (NVTX on cuda), so Nsight Systems shows units, collectives and the optimizer. */
    void (*range_push)(const char *name);
    void (*range_pop)(void);

    /* ---- memory ---- */
    void *(*alloc)(size_t bytes);                       /* zero-filled; aborts on failure */
    void (*free)(void *p);                              /* NULL is fine */
    /* alloc takes each buffer's bytes rounded up to a multiple of this from the device
     * arena (0: exactly its bytes): an arena holding a plan's buffers holds their sum,
     * each rounded */
    size_t alloc_align;
    /* Optional (NULL on cuda, where cudaMemGetInfo measures): bytes handed out by alloc
     * and not freed, counted as requested, so a run can compare what it allocated with
     * its plan */
    size_t (*allocated_bytes)(void);
    void (*zero)(void *p, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);           /* within the backend */
    void (*to_device)(void *dst, const void *host_src, size_t bytes); /* host -> backend */
    void (*to_host)(void *host_dst, const void *src, size_t bytes);   /* backend -> host */
    void (*sync)(void);
    /* Optional (NULL on cpu, where malloc, free and to_host serve): page-locked host
     * memory, which the device copies into at full speed (NULL when refused), and a
     * backend -> host copy into it queued on a side stream after the work queued so far,
     * so that the backend's stream is not drained for it; to_host_wait returns once every
     * such copy has landed. checkpoint.async's staging (src/ckpt/async.c). */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    void (*to_host_async)(void *host_dst, const void *src, size_t bytes);
    void (*to_host_wait)(void);
    /* Optional (NULL on cpu, where to_device serves): a host -> backend copy from page-locked
     * memory queued on a second side stream after the work queued so far on the backend's
     * stream; the work queued on the backend's stream after the call runs after the copy.
     * The host source must stay unchanged until to_device_wait, which returns once every
     * such copy has landed. The optimizer offload's uploads (src/engine/offload.c). */
    void (*to_device_async)(void *dst, const void *host_src, size_t bytes);
    void (*to_device_wait)(void);
    /* Optional (NULL on cpu): the device work queued between graph_begin and graph_end is
     * recorded instead of run, as one graph that graph_launch queues again at once (the same
     * kernels with the same arguments on the same pointers; the data they read is read when
     * the graph runs). Between the two only ops that queue device work may be called: no
     * to_device, to_host, sync, alloc or free, and no op that grows the scratch (run the
     * same ops once before recording, so the scratch already has their size). graph_end
     * returns NULL when the backend could not record (nothing recorded ran: queue the ops
     * again as usual). A generator replays its decode step this way: a step is a few
     * hundred short kernels, each launch costing the host about what it costs the GPU. */
    void (*graph_begin)(void);
    void *(*graph_end)(void);
    void (*graph_launch)(void *graph);
    void (*graph_free)(void *graph);

    /* ---- dtype conversion ---- */
    /* act[i] = (act_dtype) f32[i], round-to-nearest-even when act is bf16 */
    void (*f32_to_act)(void *act, const float *f32, size_t n);
    /* x[i] = bf16(x[i]) kept in fp32 storage: emulates bf16 collectives on fp32 backends */
    void (*round_to_bf16)(float *x, size_t n);
    /* bf16[i] = bf16(f32[i]), round-to-nearest-even: casts for bf16 collectives */
    void (*f32_to_bf16)(uint16_t *bf16, const float *f32, size_t n);
    /* f32[i] = bf16[i] (exact) */
    void (*bf16_to_f32)(float *f32, const uint16_t *bf16, size_t n);
    /* y[i] += x[i] over fp32 buffers (accumulating reduced gradient shards) */
    void (*accumulate)(float *y, const float *x, size_t n);

    /* ---- layers (fwd / bwd) ---- */
    /* out(N,C) = wte[tokens[i]] ; wte (V,C) act */
    void (*embedding_fwd)(void *out, const int32_t *tokens, const void *wte, int N, int C);
    /* dwte(V,C) += scatter-add of dout(N,C) rows by token */
    void (*embedding_bwd)(float *dwte, const void *dout, const int32_t *tokens, int N, int C);

    /* out(N,C) = inp / rms(inp) * weight(C); rstd(N) = 1/sqrt(mean(inp²)+eps).
     * amax (here and in swiglu_fwd / swiglu_bwd): NULL, or a float (backend memory) that
     * becomes max(*amax, max |out_i|) over the values written (in act dtype, NaN ignored;
     * the caller zeroes it): the tensorwise FP8 amax of out, made by the pass that writes
     * it, which fp8_quantize_both takes as src_amax instead of reading out again. */
    void (*rmsnorm_fwd)(void *out, float *rstd, const void *inp, const void *weight,
                        int N, int C, float eps, float *amax);
    /* dinp(N,C) += ; dweight(C) += */
    void (*rmsnorm_bwd)(void *dinp, float *dweight, const void *dout, const void *inp,
                        const void *weight, const float *rstd, int N, int C);

    /* out(N,OC) = inp(N,C) · weight(OC,C)ᵀ + residual(N,OC); residual NULL adds nothing
     * and may alias out (out += ...). The residual add is the GEMM's own C input, so a
     * block's skip connection costs no separate copy or add. */
    void (*matmul_fwd)(void *out, const void *inp, const void *weight, int N, int C, int OC,
                       const void *residual);
    /* dinp(N,C) += dout · weight (skipped when dinp is NULL);
     * dweight(OC,C) += doutᵀ · inp (skipped when dweight is NULL);
     * flags SHLM_MM_SET_DINP / SHLM_MM_SET_DWEIGHT make that output "=" instead of "+=",
     * which spares zeroing it first and reading it back inside the product. */
    void (*matmul_bwd)(void *dinp, float *dweight, const void *dout, const void *inp,
                       const void *weight, int N, int C, int OC, int flags);

    /* A linear layer's bias (the q/k/v projections of a model with qkv_bias), applied
     * after its product, outside the GEMM, so one op serves every matmul recipe (an FP8
     * product's output is act dtype like any other):
     * x(N,C) += bias(C) on every row, bias act (a gathered parameter); in fp32, rounded
     * once to act dtype. */
    void (*bias_add)(void *x, const void *bias, int N, int C);
    /* dbias(C) (+)= Σ_i dout(i, ·) over the N rows, summed in fp32 in an order fixed by
     * (N, C) alone (the same bits on every run); set != 0 makes it "=" (the caller need
     * not zero dbias first). */
    void (*bias_grad)(float *dbias, const void *dout, int N, int C, int set);

    /* ---- LoRA's adapters around a frozen product (src/model/lora_linear.h) ---- */
    /* x(n) *= a over act elements (the product in fp32, rounded once). */
    void (*scale)(void *x, size_t n, float a);
    /* Dropout, the mask a pure function of keys (kernels/dropout_mask.h: the same on every
     * backend and world size): out(N,C) = x · keep(i,c) / (1 - p), or with add != 0
     * out += that; rows are N / T sequences of T, row i's key row_keys[i / T] (backend
     * memory, N / T uint64), mixed with salt, element (i % T)·C + c of its sequence. The
     * factor 1 / (1 - p) is an fp32 quotient, the product (and sum) in fp32, rounded once
     * to act. 0 <= p < 1; out may alias x (without add). The backward is the same call on the gradient (the
     * mask is the same). */
    void (*dropout)(void *out, const void *x, int N, int T, int C, float p,
                    const uint64_t *row_keys, uint64_t salt, int add);
    /* dst(rows, cols) = src(rows, cols): act sub-matrices, row i at dst + i·dld and
     * src + i·sld elements (no overlap). */
    void (*copy2d)(void *dst, size_t dld, const void *src, size_t sld, int rows, int cols);
    /* The same over fp32 (gradients): dst = src (set != 0) or dst += src. */
    void (*f32_add2d)(float *dst, size_t dld, const float *src, size_t sld, int rows, int cols,
                      int set);
    /* DoRA's weight norms: out(j) = coef · Σ_c a(j,c)·b(j,c) over act rows of `cols`
     * (contiguous), or with add out(j) += that; summed in fp32 along the row in column
     * order, multiplied by coef once. */
    void (*row_dot)(float *out, const void *a, const void *b, int rows, int cols, float coef,
                    int add);
    /* DoRA's magnitude gradient: out(c) (+)= Σ_i a(i,c)·b(i,c) / √n2(c) for act matrices of
     * N rows of stride ld (elements; columns 0..C-1 used), summed in fp32 over the rows in
     * row order, divided by the fp32 √n2(c) once; set != 0 makes it "=". */
    void (*col_dot)(float *out, const void *a, const void *b, int ld, const float *n2, int N,
                    int C, int set);
    /* DoRA's scale: out(i,c) = residual(i,c) + g(c)·x(i,c) with g(c) = m(c) / √n2(c) (m act,
     * n2 fp32; the fp32 quotient of m and the fp32 √n2), residual NULL adding nothing; every
     * matrix of N rows of stride ld (elements), columns 0..C-1. out may alias x or
     * residual. */
    void (*dora_scale)(void *out, const void *x, const void *residual, int ld, const void *m,
                       const float *n2, int N, int C);

    /* Rotary embedding, Hugging Face rotate-half layout, in place on the first n_heads
     * heads (each rope->head_dim wide) of every row of x, rows of `stride` elements:
     * element i of a head pairs with element i + head_dim/2 and both turn by the angle
     * p·rope->freq[i], formed in double (it reaches thousands of radians, where an fp32
     * angle loses ~1e-4 of it). The rows are S sequences of T (N = S·T): row r is at
     * position p = r % T when pos0 is NULL, else p = pos0[r / T] + r % T, pos0 being S
     * int32 >= 0 in backend memory (each sequence's first position: the KV-cache decode's
     * new tokens sit after their row's cached ones; T must then divide N). rope is host
     * memory (rope_freq.h; the model fills it once), read during the call only.
     * inverse != 0 rotates by -angle, which is the backward pass (the rotation is
     * orthogonal). */
    void (*rope)(void *x, int N, int T, int stride, int n_heads, const shlm_rope *rope,
                 const int32_t *pos0, int inverse);

    /* Causal grouped-query attention. qkv (N, (nh + 2·nkv)·hd) rows hold
     * [q heads | k heads | v heads] of token (b,t), N = B·T; query head h uses kv head
     * h / (nh/nkv). out (N, nh·hd) = softmax(q·kᵀ/√hd, masked) · v;
     * lse (B, nh, T) = logsumexp of each score row (kept for the backward).
     * doc_start: NULL, the plain causal mask (query t sees keys 0..t), or B·T int32
     * (packed documents: block-diagonal attention): doc_start[b·T + t] is the position in
     * sequence b of the first token of token t's document, non-decreasing along a row and
     * at most t (so t always sees itself); query t sees keys doc_start[b·T + t]..t. The
     * backends skip the work of masked key tiles; all zeros gives NULL's results bit for
     * bit. */
    void (*attention_fwd)(void *out, float *lse, const void *qkv, const int32_t *doc_start,
                          int B, int T, int nh, int nkv, int hd);
    /* dqkv (N, (nh+2·nkv)·hd) = gradient w.r.t. qkv under the forward's mask (doc_start
     * as there, the same values). rope NULL: w.r.t. qkv as given. rope non-NULL (its
     * head_dim = hd): qkv's q and k heads are taken to hold RoPE'd values (rope above,
     * this description, positions 0..T-1) and dqkv's q and k parts are the gradients
     * w.r.t. the PRE-RoPE q and k, i.e. the inverse rotation applied to them, as
     * rope(dqkv, N, T, (nh+2·nkv)·hd, nh + nkv, rope, NULL, 1) would do afterwards; the v
     * part is the same either way. The cpu backend runs exactly that rope call (same
     * results bit for bit); cuda rotates in the fp32 accumulators of its Hopper kernels
     * before their one rounding to bf16 (so not bitwise equal to attention then rope,
     * which rounds twice) and runs the rope kernel after the kernels that cannot. */
    void (*attention_bwd)(void *dqkv, const void *dout, const void *qkv, const void *out,
                          const float *lse, const int32_t *doc_start, int B, int T, int nh,
                          int nkv, int hd, const shlm_rope *rope);

    /* ---- generation with a KV cache ----
     * A cache is two act tensors k_cache and v_cache of (B, nkv, cap, hd): element d of kv
     * head kh of row b's token at position p sits at [((b·nkv + kh)·cap + p)·hd + d], so
     * each (row, kv head) holds its keys (values) as one contiguous cap x hd matrix.
     * Rows are right-padded: pos (backend memory, B int32, the caller's) says row b holds
     * pos[b] tokens, at positions 0..pos[b]-1, its own positions whatever the other rows'
     * lengths (as if it ran alone); slots from pos[b] on are free, and what a longer
     * padded prompt left there is never read. qkv (B·Tn, (nh + 2·nkv)·hd) holds the Tn
     * new tokens of each row, laid out as attention_fwd's, q and k already RoPE'd at
     * their positions pos[b] + t (rope with pos0 = pos). The ops leave pos as it is: the
     * caller adds Tn after the step. Requires 0 <= pos[b] and pos[b] + Tn <= cap: the cpu
     * aborts naming the row; cuda cannot stop from the device, so it leaves that row's
     * cache alone and writes NaN into its out.
     * Prefill: attention_fwd over the right-padded prompts (B·Tn rows, plain causal mask:
     * no real token sees the padding after it), then kv_append with pos all 0, then pos[b]
     * = prompt length of row b; or attention_decode itself with pos all 0 and Tn the
     * padded length, which gives the same out (cpu: the same bits as attention_fwd; cuda:
     * attention_fwd's tensor-core kernel is the faster for long prompts). */
    /* The k and v heads of token t of row b into slot pos[b] + t of its cache. */
    void (*kv_append)(void *k_cache, void *v_cache, const void *qkv, const int32_t *pos, int B,
                      int Tn, int cap, int nh, int nkv, int hd);
    /* kv_append, then out (B·Tn, nh·hd) = softmax(q·kᵀ/√hd)·v of each new query t of row
     * b over its cache's slots 0..pos[b] + t (causal within the new tokens; query head h
     * uses kv head h / (nh/nkv)). No logsumexp: there is no backward. */
    void (*attention_decode)(void *out, void *k_cache, void *v_cache, const void *qkv,
                             const int32_t *pos, int B, int Tn, int cap, int nh, int nkv,
                             int hd);

    /* gu (N, 2F) rows hold [gate | up]; out (N,F) = silu(gate) * up; amax as rmsnorm_fwd's */
    void (*swiglu_fwd)(void *out, const void *gu, int N, int F, float *amax);
    /* dgu (N, 2F) = ; amax as rmsnorm_fwd's, over the whole of dgu */
    void (*swiglu_bwd)(void *dgu, const void *dout, const void *gu, int N, int F, float *amax);

    /* Softmax cross-entropy over logits (N,V) with targets (N):
     * losses[i] = -log softmax(logits_i)[targets[i]], 0 for ignored rows;
     * if dlogits is non-NULL, dlogits_i = (softmax(logits_i) - onehot) * dscale
     * (0 for ignored rows). dlogits may alias logits. */
    void (*xent_fwd_bwd)(float *losses, void *dlogits, const void *logits,
                         const int32_t *targets, int N, int V, float dscale);

    /* ---- FP8 matmul (all Optional: NULL on a backend without it) ----
     * The scaling rule (both backends, bit for bit): amax = the largest |x| over the
     * matrix (tensorwise) or over each row of the quantized matrix (rowwise), NaN
     * ignored; scale = fmax(format) / max(amax, 1e-12f) in fp32 (IEEE division);
     * codes = fp8(x · scale) as above; scale_inv = 1.0f / scale. */
    /* 0 when this backend can run FP8 matmuls on the bound device, else -1 with one line
     * in why naming the device and what FP8 needs (cuda: compute capability 8.9 or 9.0). */
    int (*fp8_check)(char *why, size_t whylen);
    /* q = quantize(src): src is an act matrix of q->rows x q->cols (transpose = 0) or of
     * q->cols x q->rows (transpose = 1: q holds srcᵀ, so each of q's rows is a column of
     * src). Writes q->codes and q->scale_inv by the rule above, q->format and q->scaling
     * as the caller set them. */
    void (*fp8_quantize)(const shlm_fp8_matrix *q, const void *src, int transpose);
    /* q = quantize(src) and q_t = quantize(srcᵀ) for src an act matrix of q->rows x
     * q->cols (q_t: q->cols x q->rows, q's format and scaling): bit for bit the two
     * fp8_quantize calls, in one pass over src where the scaling lets both layouts share
     * it (tensorwise: one amax, then both layouts written from one read of src).
     * src_amax: NULL, or (tensorwise only) a float (backend memory) holding max |src| as
     * the op that wrote src made it (rmsnorm_fwd's amax): used as the amax, so src is read
     * once; the same codes and scales as NULL gives when it is src's. */
    void (*fp8_quantize_both)(const shlm_fp8_matrix *q, const shlm_fp8_matrix *q_t,
                              const void *src, const float *src_amax);
    /* FP8 weights made from fp32 parameters (E4M3, tensorwise), by the rule above with
     * x = bf16(p) when round_bf16 (the parameters as a bf16 gather would give them) and
     * x = p otherwise; amax, scale and scale_inv are single device floats.
     * fp8_param_amax: *amax = max(*amax, max |x_i|) over n (the caller zeroes it; NaN
     * ignored; round_bf16 needs no argument here since bf16 rounding is monotonic:
     * max |bf16(p)| = bf16(max |p|), which fp8_param_scale applies).
     * fp8_param_scale: *scale_inv = 1 / scale(a), a = bf16(*amax) when round_bf16.
     * fp8_param_cast: codes[i] = e4m3(x_i · scale(a)) over n, a as fp8_param_scale's.
     * Codes and scale_inv are bit for bit fp8_quantize's over the same x (tensorwise). */
    void (*fp8_param_amax)(float *amax, const float *p, size_t n);
    void (*fp8_param_scale)(float *scale_inv, const float *amax, int round_bf16);
    void (*fp8_param_cast)(uint8_t *codes, const float *p, size_t n, const float *amax,
                           int round_bf16);
    /* dst (cols x rows) = srcᵀ for src (rows x cols) of FP8 codes (bytes); no overlap. */
    void (*fp8_transpose)(uint8_t *dst, const uint8_t *src, int rows, int cols);
    /* out(M,N) = (a(M,K) · b(N,K)ᵀ) · scales + c, with M = a->rows, N = b->rows,
     * K = a->cols = b->cols, both operands K-contiguous (cuBLASLt's FP8 "TN" form), the
     * products of decoded values summed in fp32, then multiplied by a's scale (of the row,
     * rowwise) and b's scale (of the column's row of b). a and b have the same scaling; at
     * most one of them is E5M2. flags: SHLM_FP8_OUT_F32: out is fp32, else act dtype;
     * SHLM_FP8_FAST_ACCUM (with an act-dtype out): the backend may sum at its tensor cores'
     * reduced precision instead of fp32 (cuBLASLt's FAST_ACCUM; the cpu emulation sums in
     * fp32 regardless). c is NULL or a matrix like out (same dtype and shape) and may alias
     * out (out += ...). */
    void (*matmul_fp8)(void *out, int flags, const shlm_fp8_matrix *a,
                       const shlm_fp8_matrix *b, const void *c);

    /* ---- NF4 (QLoRA's frozen base weights; the format: kernels/nf4.h) ----
     * out[i - begin] = act(x̂_i) for the values i in [begin, end) of the NF4 tensor q (its
     * arrays in backend memory, the struct on the host): x̂_i = fp32(shlm_nf4_code[c_i] ·
     * absmax_b), b = i / 64, absmax_b q->absmax[b] or, with double quant, the fp32 product
     * and sum of kernels/nf4.h (never fused) — bitsandbytes' dequantize_4bit values. act:
     * bf16 rounds x̂_i to nearest even; the cpu's fp32 keeps x̂_i, and round_to_bf16 on out
     * then gives the bf16 values bit for bit (a cpu run gathering bf16 parameters does
     * that). begin must be a multiple of 64 (a block's first value: shards of an NF4
     * tensor start on block boundaries, so a shard's region dequantizes on its own) and
     * begin <= end <= q->n (aborts otherwise); out (end - begin act elements) is all that
     * is written. */
    void (*nf4_dequantize)(void *out, const shlm_nf4 *q, size_t begin, size_t end);

    /* ---- optimizer and reductions over flat fp32 buffers ---- */
    /* AdamW with decoupled weight decay on n elements; g = grad * grad_scale;
     * step is 1-based (bias correction). param -= lr·(m̂/(√v̂+eps) + wd·param). amax: NULL,
     * or a device float that becomes max(*amax, max |param_i|) over the updated values (NaN
     * ignored): fp8_param_amax's, made by the step that writes the weights. */
    void (*adamw)(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                  int step, float *amax);
    /* Σ x[i]², accumulated in double, returned to the host */
    double (*sum_squares)(const float *x, size_t n);
} shlm_ops;

/* Profiler ranges, no-ops on backends without them. */
static inline void shlm_range_push(const shlm_ops *o, const char *name) {
    if (o->range_push) o->range_push(name);
}
static inline void shlm_range_pop(const shlm_ops *o) {
    if (o->range_pop) o->range_pop();
}

/* Backends compiled into this build, NULL-terminated. */
extern const shlm_ops *const shlm_backends[];

/* The backend named `name` ("cpu", "cuda"), or NULL if it is not built in. */
const shlm_ops *shlm_ops_find(const char *name);

/* The cpu backend (always built). */
extern const shlm_ops shlm_ops_cpu;

#endif
