/* cuda backend: Hopper (sm_90a) building blocks shared by the wgmma kernels
 * (attention_sm90.cu, attention_bwd_sm90.cu): cp.async copies to a shared address, proxy
 * fences, warpgroup MMA issue/commit/wait, register fences, 128-byte-swizzled shared-memory
 * matrix descriptors, and the m64nNk16 bf16 wgmma forms the kernels use (named barriers,
 * cp.async groups, pack_bf16 and ex2 are cuda_common.cuh's).
 *
 * Verified on an H200 by tests/gpu/attn_sm90_check.cu (the forward against the mma.sync
 * kernel and a float64 reference): the K-major descriptor (LBO 16, SBO 1024, k-steps of
 * +32 bytes inside the swizzle atom), the N-major one with tnspB = 1 (LBO = the stride
 * between 64-column panels, SBO = 1024), and the register-A fragment equal to
 * mma.m16n8k16's A fragment per warp.
 *
 * Only device code compiled for sm_90a may use these (SHLM_WGMMA == 1). */
#pragma once

#include "kernels/cuda/cuda_common.cuh"

/* The device code exists only for sm_90a: wgmma is an arch-specific feature. Any other
 * target compiles empty kernels that are never launched (the probe below says so). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SHLM_WGMMA 1
#else
#define SHLM_WGMMA 0
#endif

#if SHLM_WGMMA
namespace shlm_wgmma {

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
/* this thread's completed generic-proxy writes to shared memory (cp.async included)
 * become visible to async-proxy readers (wgmma) after the barrier that follows */
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* The compiler must neither read nor write these registers across the asm: placed after
 * a wait, it keeps the uses of asynchronous results after the wait. */
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}

/* 128-byte-swizzled shared-memory matrix descriptor (see the top of the file) */
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
/* the same descriptor with its start address moved by `bytes` (a multiple of 16; no
 * carry out of the 14-bit field: shared addresses stay below 256 KiB) */
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) {
    return d + (uint64_t)(bytes >> 4);
}

#define SHLM_D8(i)                                                                         \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define SHLM_D32 SHLM_D8(0), SHLM_D8(8), SHLM_D8(16), SHLM_D8(24)
#define SHLM_D64 SHLM_D32, SHLM_D8(32), SHLM_D8(40), SHLM_D8(48), SHLM_D8(56)
#define SHLM_R32                                                                           \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define SHLM_R64                                                                           \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "  \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "  \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

/* D(64×128) (+)= A(64×16, shared, K-major) · B(16×128, shared, K-major) */
template <int SCALE_D>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SHLM_R64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : SHLM_D64
                 : "l"(da), "l"(db), "n"(SCALE_D));
}
/* D(64×64) (+)= A(64×16, shared, K-major) · B(16×64, shared, K-major) */
template <int SCALE_D>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SHLM_R32
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : SHLM_D32
                 : "l"(da), "l"(db), "n"(SCALE_D));
}
/* D(64×128) += A(64×16, registers) · B(16×128, shared, N-major: tnspB = 1) */
__device__ __forceinline__ void wgmma_rs_n128_t(float (&d)[64], const uint32_t *a, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SHLM_R64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : SHLM_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(1));
}
/* D(64×64) += A(64×16, registers) · B(16×64, shared, N-major: tnspB = 1) */
__device__ __forceinline__ void wgmma_rs_n64_t(float (&d)[32], const uint32_t *a, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SHLM_R32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : SHLM_D32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(1));
}
#undef SHLM_D8
#undef SHLM_D32
#undef SHLM_D64
#undef SHLM_R32
#undef SHLM_R64

} /* namespace shlm_wgmma */
#endif
