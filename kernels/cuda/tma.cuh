/* cuda backend: Hopper (sm_90a) asynchronous-copy building blocks for the warp-specialised
 * attention forward (attention_sm90.cu): shared-memory mbarriers (init, arrive,
 * arrive.expect_tx, try_wait.parity), predicated named-barrier arrive, setmaxnreg, TMA tile loads (cp.async.bulk.tensor.3d with
 * mbarrier::complete_tx::bytes) and 1-d bulk copies (cp.async.bulk, for attention_bwd_sm90.cu's dQ) from a CUtensorMap passed as a __grid_constant__ kernel
 * parameter. The tensor map itself is encoded on the host (cuTensorMapEncodeTiled, obtained
 * through cudaGetDriverEntryPointByVersion: nothing links -lcuda); see attention_sm90.cu.
 *
 * Only device code compiled for sm_90a may use these (SHLM_WGMMA == 1, from wgmma.cuh). */
#pragma once

#include "kernels/cuda/wgmma.cuh"

#include <cuda.h> /* CUtensorMap (the type only; no driver call is linked) */

#if SHLM_WGMMA
namespace shlm_tma {

/* ---------------------------------------------------------------- mbarrier */

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* makes the initialisations visible to the async proxy (TMA's complete_tx); a
 * __syncthreads after it publishes them to the other threads */
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* one arrival (release semantics: this thread's earlier accesses happen before) */
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* the same where pred is nonzero: a predicated instruction, not a branch, so that no
 * divergent path lies between wgmma instructions (ptxas would then serialise them) */
__device__ __forceinline__ void mbar_arrive_if(uint32_t bar, bool pred) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n"
                 "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar), "r"((int)pred)
                 : "memory");
}
/* one arrival that also announces `bytes` of transactions (the TMA loads that follow
 * complete them) */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
/* announces `bytes` of transactions without arriving (the TMA loads that follow
 * complete them; the phase cannot complete before the expected arrivals either) */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
/* waits until the phase of parity `parity` has completed (acquire semantics) */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* the executing warpgroup's per-thread register count moves to N (all its warps execute
 * it; N a multiple of 8 in 24..256): producers give registers back, consumers take them */
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* bar_arrive (cuda_common.cuh) where pred is nonzero, as a predicated instruction */
__device__ __forceinline__ void bar_arrive_if(int id, int n, bool pred) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n"
                 "@p bar.arrive %0, %1;\n}\n" ::"r"(id), "r"(n), "r"((int)pred)
                 : "memory");
}

/* ---------------------------------------------------------------- TMA */

__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
/* the box at coordinates (c0, c1, c2) (innermost first) into shared memory at dst; its
 * bytes complete transactions on the mbarrier bar. Out-of-bounds elements are zeros. */
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                            int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

/* bytes (a multiple of 16) from global src (16-byte aligned) to shared dst (16-byte
 * aligned) as one bulk copy (no tensor map, no swizzle); they complete transactions on
 * the mbarrier bar (announce them with expect_tx first) */
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes,
                                          uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
                 : "memory");
}

} /* namespace shlm_tma */
#endif

/* ---------------------------------------------------------------- host: tensor maps
 *
 * Used by the warp-specialised kernels of attention_sm90.cu (boxes of 128 rows) and
 * attention_bwd_sm90.cu (128 and 64). */
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled */
#include <cuda_runtime.h>

namespace shlm_tma_host {

/* cuTensorMapEncodeTiled from the driver, asked once per process through the runtime (the
 * build does not link libcuda); null when the driver has none */
inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    static bool asked = false;
    if (!asked) {
        asked = true;
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
        const cudaError_t e =
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
#else
        const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q);
#endif
        if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && p)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
        else
            (void)cudaGetLastError(); /* not sticky; leave no error behind */
    }
    return fn;
}

/* a bf16 tensor (column < cols, row < rows, batch < B) with row stride cols elements and
 * batch stride rows·cols, as a 3-d map with box 64 columns × box_rows rows × 1 and the
 * 128-byte swizzle: one 64-column panel of the wgmma kernels' layout per load; elements out
 * of bounds (rows >= rows) arrive as zeros. False when the driver cannot make it (no entry
 * point, or a shape TMA refuses: cols·2 must be a multiple of 16, box_rows <= 256). */
inline bool make_map_bf16_3d(CUtensorMap *map, const void *base, size_t cols, int rows, int B,
                             int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = encode_fn();
    if (!enc || rows <= 0 || B <= 0 || box_rows <= 0 || box_rows > 256) return false;
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)B};
    const cuuint64_t strides[2] = {(cuuint64_t)cols * 2, (cuuint64_t)rows * cols * 2}; /* bytes */
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1};
    const cuuint32_t estr[3] = {1, 1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void *>(base), dims, strides,
               box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

} /* namespace shlm_tma_host */
