/* Shared by every .cu file of kernels/cuda: the CUDA_CHECK / CUBLAS_CHECK macros, the
 * backend's stream and scratch memory, bf16 vector helpers, block reductions and the PTX
 * primitives the attention kernels share (named barriers, cp.async copies and groups, tile
 * loads, bf16 pairs, ex2). */
#ifndef SHLM_KERNELS_CUDA_COMMON_CUH
#define SHLM_KERNELS_CUDA_COMMON_CUH

/* the C headers first, outside extern "C": libstdc++'s <stdlib.h> wrapper declares C++
 * overloads that must not get C linkage; check.h's own includes are then no-ops */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "kernels/check.h"
}
#include "kernels/cuda/cuda.h" /* has its own extern "C" */

/* ------------------------------------------------------------------ checks */

/* One failure path for both libraries: the call text, the library's own name and text
 * for the status, the device, then shlm_fatal_at (file:line, rank, host, MPI_Abort). */
[[noreturn]] static inline void shlm_cuda_fail_(const char *file, int line, const char *call,
                                               const char *status) {
    int dev = -1;
    /* after a sticky error this may fail too; dev then stays -1 */
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    shlm_fatal_at(file, line, "%s failed: %s (device %d)", call, status, dev);
}

/* Evaluates `call` (a cudaError_t expression) once. */
#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t cuda_check_rc_ = (call);                                              \
        if (cuda_check_rc_ != cudaSuccess) {                                              \
            char cuda_check_msg_[256];                                                    \
            snprintf(cuda_check_msg_, sizeof cuda_check_msg_, "%s: %s",                   \
                     cudaGetErrorName(cuda_check_rc_), cudaGetErrorString(cuda_check_rc_)); \
            shlm_cuda_fail_(__FILE__, __LINE__, #call, cuda_check_msg_);                  \
        }                                                                                 \
    } while (0)

/* Evaluates `call` (a cublasStatus_t expression: cuBLAS or cuBLASLt) once. */
#define CUBLAS_CHECK(call)                                                                \
    do {                                                                                  \
        cublasStatus_t cublas_check_rc_ = (call);                                         \
        if (cublas_check_rc_ != CUBLAS_STATUS_SUCCESS) {                                  \
            char cublas_check_msg_[256];                                                  \
            snprintf(cublas_check_msg_, sizeof cublas_check_msg_, "cuBLAS status %d: %s", \
                     (int)cublas_check_rc_, cublasGetStatusString(cublas_check_rc_));     \
            shlm_cuda_fail_(__FILE__, __LINE__, #call, cublas_check_msg_);                \
        }                                                                                 \
    } while (0)

/* Every launcher ends with this: a bad launch configuration is reported here, at the
 * launcher that made it, not at some later synchronising call. */
#define CUDA_CHECK_LAST() CUDA_CHECK(cudaGetLastError())

/* ---------------------------------------------------- stream and scratch (memory.cu) */

/* The backend's stream (see shlm_cuda_stream_handle in cuda.h). */
cudaStream_t shlm_cuda_stream(void);

/* A device buffer of at least `bytes`, shared by all ops: every op runs on the one
 * stream, so an op may use it freely between its first and last launch. Growing it
 * synchronises the stream first (the old buffer may still be in use). Contents are
 * undefined. */
void *shlm_cuda_scratch(size_t bytes);

/* Waits on the host until everything queued on s has run. With a host-wait hook set
 * (shlm_cuda_set_host_wait_hook) it polls the stream and calls the hook meanwhile
 * instead of blocking in the driver; every host wait of a training step goes through it,
 * and a copy to or from host memory first drains the stream with it (a pageable copy can
 * block the host inside the driver until the stream reaches it). */
void shlm_cuda_host_wait(cudaStream_t s);

/* Multiprocessor count of the current device (cached). */
int shlm_cuda_sm_count(void);

/* ------------------------------------------- cuBLASLt products (matmul.cu) */

/* One product D(m,n) = scale_a·scale_b·(op(A)·op(B)) + beta·C in cuBLASLt's column-major
 * terms, fp32 compute; C and D have one type and layout (ldc), C may be D. scale_mode -1:
 * no scale pointers; else a cublasLtMatmulMatrixScale_t for both A and B with a_scale and
 * b_scale its device pointers (SCALAR_32F: one float each; OUTER_VEC_32F: m and n floats).
 * fast_accum: CUBLASLT_MATMUL_DESC_FAST_ACCUM (FP8 operands only). */
typedef struct shlm_lt_product {
    int transa, transb;
    int m, n, k, lda, ldb, ldc;
    cudaDataType_t atype, btype, ctype;
    int scale_mode;
    int fast_accum;
    const void *A, *B, *C;
    void *D;
    const float *a_scale, *b_scale;
    float beta;
} shlm_lt_product;

/* Queues g on the backend's stream through matmul.cu's one handle, workspace and plan
 * cache (a plan per shape, types, scaling and operand alignments). Returns 1 when queued;
 * 0 when cuBLASLt has no algorithm for it (the heuristic offered none, or the library
 * refused the plan's first call): nothing is queued, the caller runs its own fallback,
 * and later calls with the same plan return 0 at once. Any other failure aborts with
 * the shape in the message. */
int shlm_cuda_lt_product(const shlm_lt_product *g);

/* ------------------------------------------------------------------ helpers */

typedef __nv_bfloat16 bf16;

static inline unsigned int shlm_cuda_blocks(size_t work, int per_block, size_t cap) {
    size_t b = (work + (size_t)per_block - 1) / (size_t)per_block;
    if (b < 1) b = 1;
    if (b > cap) b = cap;
    return (unsigned int)b;
}

/* True when p is aligned to `a` bytes (a power of two). */
static inline bool shlm_aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* 8 bf16 = 16 bytes: the unit of every vectorised load and store of act tensors. */
struct alignas(16) bf16x8 {
    __nv_bfloat162 h[4];
};

__device__ __forceinline__ void load_bf16x8(float f[8], const bf16 *p) {
    bf16x8 v = *reinterpret_cast<const bf16x8 *>(p);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(v.h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

__device__ __forceinline__ void store_bf16x8(bf16 *p, const float f[8]) {
    bf16x8 v;
#pragma unroll
    for (int i = 0; i < 4; i++) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *reinterpret_cast<bf16x8 *>(p) = v;
}

/* A grid-stride loop over n elements, four at a time where vec (every buffer 16-byte
 * aligned: the launcher's check): each thread calls group(k) for its groups k of elements
 * [4k, 4k + 4) below 4·(n/4), then one(k) for its elements after them (all of them
 * without vec). */
template <class Group, class One>
__device__ __forceinline__ void grid_stride_x4(size_t n, bool vec, Group group, One one) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (vec) {
        const size_t nv = n / 4;
        for (size_t k = i; k < nv; k += stride) group(k);
        done = nv * 4;
    }
    for (size_t k = done + i; k < n; k += stride) one(k);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block, returned to every thread. blockDim.x must be a multiple of 32 (at
 * most 1024); `shared` holds 32 floats. Ends with a barrier-protected read, so the
 * caller may reuse `shared` after it returns only behind another __syncthreads. The
 * reduction order is fixed, so results are deterministic. */
__device__ __forceinline__ float block_sum(float v, float *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* an earlier call's readers are done with `shared` */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nw ? shared[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Maximum over the block, returned to every thread; the same conditions on blockDim.x
 * and `shared` as block_sum. fmaxf ignores a NaN operand, so NaN never wins. */
__device__ __forceinline__ float block_max(float v, float *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nw ? shared[lane] : -INFINITY;
    return warp_max(v);
}

/* An amax is kept as the bits of a non-negative float while it is being reduced: those
 * order as unsigned integers, so atomicMax on them is the float maximum (±0 and +inf
 * included; fmaxf has dropped every NaN before). The buffer starts at 0 (or an amax).
 * The value only grows, so a block whose m is not above what it reads there has nothing
 * to add and skips the atomic: thousands of blocks merging into one word otherwise queue
 * on it at the end of each wave. */
__device__ __forceinline__ void amax_merge(unsigned *amax_bits, float m) {
    const unsigned v = __float_as_uint(m);
    if (v > *reinterpret_cast<volatile unsigned *>(amax_bits)) atomicMax(amax_bits, v);
}

/* A producer's amax of what it stored (ops.h rmsnorm_fwd's amax): m is the thread's max |v|
 * over the fp32 values before their bf16 rounding. Rounding to nearest even is monotonic
 * and symmetric, so the max of the stored values is m rounded once. Every thread of the
 * block calls it (a block reduction); amax_bits NULL does nothing. */
__device__ __forceinline__ void block_amax_merge(unsigned *amax_bits, float m, float *shared) {
    if (!amax_bits) return; /* the same for the whole block */
    m = block_max(m, shared);
    if (threadIdx.x == 0) amax_merge(amax_bits, __bfloat162float(__float2bfloat16_rn(m)));
}

/* The bound device and its properties: 0, or -1 with one line in why (the device checks
 * answer with it rather than abort). */
static inline int shlm_cuda_bound_device(int *dev, cudaDeviceProp *p, char *why, size_t whylen) {
    if (cudaGetDevice(dev) != cudaSuccess || cudaGetDeviceProperties(p, *dev) != cudaSuccess) {
        cudaError_t rc = cudaGetLastError();
        snprintf(why, whylen, "cannot query the bound device: %s", cudaGetErrorString(rc));
        return -1;
    }
    return 0;
}

/* ------------------------------------------- primitives of the attention kernels */

/* Named barriers 1..15 among n threads (a multiple of 32): bar_arrive signals without
 * waiting, bar_sync waits for all n; the arriving threads' earlier shared-memory writes
 * are visible to the waiting ones once it completes. Barrier 0 is __syncthreads'. */
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* cp.async groups (Ampere+): commit closes this thread's copies issued since the last
 * commit into a group; wait_all waits for all of its groups. The copies' results are
 * visible to other threads after a barrier that follows the wait. */
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* 16 bytes global -> shared without passing through registers (Ampere+), so a
 * tile's copy runs while the previous one is being used. valid = false copies no source
 * byte and zero-fills the destination. Completion: cp_async_wait, then a barrier. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem);
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
}
/* waits until at most N of this thread's committed groups are still in flight */
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Starts copying ROWS rows × HDP columns from global memory (row stride ld elements) into
 * a shared tile (row stride HDP + 8); rows >= nrows and columns >= hd become zeros. With
 * vec (16-byte aligned rows) the copy is asynchronous and belongs to the caller's next
 * cp_async_commit group; otherwise it is done element by element before returning.
 * Either way the tile may be read only after a barrier that follows the wait. NTHR
 * threads (the block) share the work. */
template <int ROWS, int HDP, int NTHR>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *g, size_t ld, int nrows, int hd,
                                          bool vec) {
    constexpr int SS = HDP + 8;
    if (vec) {
        constexpr int CH = HDP / 8;
#pragma unroll 4
        for (int i = threadIdx.x; i < ROWS * CH; i += NTHR) {
            const int r = i / CH, c = (i % CH) * 8;
            const bool ok = r < nrows && c < hd;
            cp_async16(s + r * SS + c, ok ? g + (size_t)r * ld + c : g, ok);
        }
    } else {
        for (int i = threadIdx.x; i < ROWS * HDP; i += NTHR) {
            const int r = i / HDP, c = i % HDP;
            bf16 v = __float2bfloat16_rn(0.0f);
            if (r < nrows && c < hd) v = g[(size_t)r * ld + c];
            s[r * SS + c] = v;
        }
    }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* lo in the low half = lower index */
    return *reinterpret_cast<uint32_t *>(&v);
}

/* 2^x: the bare MUFU instruction (2^-inf = 0; subnormal results flush to 0) */
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif
