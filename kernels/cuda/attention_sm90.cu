/* cuda backend: causal grouped-query flash attention forward for Hopper (sm_90a) on
 * warpgroup MMA (wgmma.mma_async, bf16 operands, fp32 accumulation). Same contract as
 * shlm_cuda_attention_fwd in attention.cu, for head_dim 64 and 128 only; the caller falls
 * back to that kernel whenever this one returns 1.
 *
 * STATUS. The default is attn_fwd_ws below (a producer warpgroup loads Q, K, V by TMA
 * into a 2-stage mbarrier ring; two consumer warpgroups run the overlapped schedule of
 * attn_fwd_wgmma), persistent with a dynamic tile counter (variant 8) when there are more
 * (query tile, head, batch) tiles than SMs, else one block per tile (variant 2): in a
 * single wave the persistent form gains nothing and measured slightly slower. The static
 * persistent split (6, 7) is kept as a variant only: it assumes every SM is free, and
 * with 16 SMs held ~100 us by another stream's kernel (as NCCL's are in training) it took
 * 347.0 us against 258.9 for the dynamic one (hd 128 below).
 * Measured on an H200 by tests/gpu/attn_sm90_check.cu (built with nvcc alone as its
 * header says; run as `.gpu/fwd/attn_sm90_check`, then `compute-sanitizer --tool memcheck
 * .gpu/fwd/attn_sm90_check --small`), all pipelines in one call, B=1 T=4096 nh=32, us
 * (TFLOP/s with 4·hd flops per causal pair), and in brackets the same with 16 SMs held:
 *   hd 128: attention.cu mma.sync 465.7 (295.2); variant 0 (attn_fwd_wgmma overlapped)
 *     349.4 (393.4); 1 serial 359.8; 2 ws 244.8 (561.6) [279.4]; 3 ws ping-pong 245.2
 *     [280.2]; 4 ws 3 stages 246.5 [280.1]; 5 ws 3 stages ping-pong 262.4 [282.2]; 6
 *     persistent static 242.7 [347.0]; 7 the same ping-pong 240.0 [345.7]; 8 persistent
 *     dynamic 241.4 (569.6) [258.9].
 *   hd 64: mma.sync 267.4; 0: 248.6; 1: 238.4; 2: 182.5 [195.2]; 3: 189.3 [201.8]; 4:
 *     183.0 [195.9]; 5: 190.7 [202.7]; 6: 171.9 [266.8]; 7: 176.1 [274.5]; 8: 169.4
 *     (405.9) [183.8].
 *   B=2 T=1000 nh=8 nkv=2 (128 tiles: one wave): hd 128 v2 18.7 us, v8 19.0 (mma.sync
 *     43.1); hd 64 v2 14.9, v8 15.9 (26.6).
 * Run to run the same kernels vary by ~3% (an earlier call: hd 128 v2 237.6, v6 234.7).
 * Every variant, every case: out within 2.4e-3 (max |d| / max |ref|) of attention.cu's
 * kernel, T = 130 cases within 2.4e-3 of a float64 reference, lse within 2.5e-7; a second
 * run bitwise equal; variants 2-5 bitwise equal to variant 0 (same products in the same
 * order: seen in the first run, before 6-8 existed; 6-8 do the same products in the same
 * order); compute-sanitizer memcheck clean on the small cases (all variants).
 * Ping-pong (FA3's inter-warpgroup schedule) stays within run-to-run noise of the same
 * pipeline without it at T = 4096 (slower at hd 64, and with 3 stages at hd 128), a few
 * per cent faster in the one-wave case; a first build of it measured 326 us because
 * ptxas serialised its wgmma (C7520: a branch between the products; now predicated).
 * The index math of variants 0-1 is also modelled on the CPU by
 * tests/gpu/attn_sm90_model.py. Built with nvcc 13.0 for sm_90a (ptxas -v): attn_fwd_ws
 * 168 registers at launch for every variant and hd (setmaxnreg then gives the consumers
 * 240, the producer 24), no spills, no C7519/C7520 advisories; attn_fwd_wgmma hd 128
 * overlapped 200 registers, serial 204; hd 64 162, 183; no spills. Dynamic shared memory:
 * attn_fwd_wgmma 164,864 bytes at hd 128 (82,944 at hd 64); attn_fwd_ws (1 + 2·STAGES)
 * tiles + 1 KiB, one tile more (O staging) when persistent: 197,632 bytes at hd 128 for
 * variants 6-8; plus 1 KiB static for the mbarriers and the tile slots.
 *
 * ---------------------------------------------------------------- design
 *
 * Shapes (ops.h): qkv (B·T, (nh + 2·nkv)·hd) rows hold [q heads | k heads | v heads]; out
 * (B·T, nh·hd); lse (B, nh, T) fp32, natural log; query head h reads kv head h / (nh/nkv).
 *
 * Tiles. One CTA = 256 threads = two warpgroups (WG 0: threads 0-127, WG 1: 128-255) and
 * 128 queries (rows q0..q0+127): warpgroup w owns rows 64w..64w+63, one m64 wgmma tile.
 * Keys stream in tiles of 128: S = Q·Kᵀ is one m64n128 product per warpgroup (hd/16
 * k-steps of 16), O += P·V one m64n{hd} product (8 k-steps over the tile's 128 keys).
 * The query tile qt visits key tiles 0..qt; only tile qt (the diagonal: BM == BN) is masked.
 * Blocks are (head, query tile, batch) with the query tiles in reverse order: the longest
 * rows start first, as in attention.cu. No warp specialisation: both warpgroups copy
 * (this is attn_fwd_wgmma, variants 0-1; attn_fwd_ws has its own notes further down).
 *
 * Copies. Plain cp.async (16 bytes per instruction, zero-filled past T) by all 256
 * threads, then cp.async.wait_group 0, fence.proxy.async.shared::cta (cp.async writes
 * belong to the generic proxy, wgmma reads through the async proxy), __syncthreads.
 * K and V are double-buffered. TMA (cp.async.bulk.tensor + mbarrier) with a producer warp
 * would free the issue slots these copies take: the obvious next step.
 *
 * Shared memory (1024-byte aligned by hand; each tile is 128 rows):
 *   Q [128][hd], K[2][128][hd], V[2][128][hd]: 5 tiles of 128·hd·2 bytes =
 *   160 KiB at hd = 128 (80 KiB at 64), plus 1 KiB of alignment slack.
 * Every tile is stored as hd/64 "panels" of 128 rows × 64 columns; a panel row is 128
 * bytes (8 chunks of 16 bytes) and chunk c of row r sits at chunk position c ^ (r % 8):
 * the 128-byte swizzle (CUTLASS Swizzle<3,4,3>, TMA's SWIZZLE_128B). A panel is 16 KiB and
 * 1024-aligned, so every 8-row group (1024 bytes) is one swizzle atom, aligned as the
 * hardware wants for matrix base offset 0. The same byte layout serves all three operands:
 *   Q (A of S = Q·Kᵀ): K-major (head dim contiguous), tnspA = 0;
 *   K (B of S):         K-major, tnspB = 0 (B(k = dim, n = key) = K[key][dim]);
 *   V (B of O += P·V):  B(k = key, n = dim) = V[key][dim] is N-major (dim contiguous), so
 *                       tnspB = 1 (allowed for bf16 only), no transposed copy of V.
 * The O tile is staged for its 16-byte stores in the warpgroup's own Q rows, same layout.
 *
 * Matrix descriptor (64 bits; PTX ISA "Matrix Descriptor Format"):
 *   bits  0-13  start address >> 4        bits 16-29  leading byte offset (LBO) >> 4
 *   bits 32-45  stride byte offset (SBO) >> 4   bits 49-51 base offset (0 here)
 *   bits 62-63  swizzle: 1 = 128-byte
 *   Q, K (K-major, 128B swizzle): SBO = 1024 (from one 8-row group to the next), LBO
 *       unused for swizzled K-major layouts, encoded as 1 (16 bytes) like CUTLASS does.
 *       k-step kk of 16 columns: start + (kk / 4)·16384 (the panel) + (kk % 4)·32 bytes
 *       (a 32-byte step inside the 128-byte swizzled row: the hardware applies the XOR to
 *       the computed address, as CUTLASS's descriptor iterator and DeepGEMM rely on;
 *       ThunderKittens' st_descriptor uses the same LBO 16, SBO 1024 and k-chunk offsets
 *       for its identically laid out swizzled tiles).
 *       (Confirmed on the H200, as are the two points below.)
 *   V (N-major, 128B swizzle): LBO = 16384 (from one 64-column panel to the next: n128
 *       spans both panels), SBO = 1024 (from keys 0-7 to keys 8-15 of the k-step);
 *       k-step kk: start + kk·16·128 bytes (16 key rows). These follow the canonical
 *       MN-major layout ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) of the PTX ISA and CUTLASS's
 *       make_gmma_desc<Major::MN> (stride_01 -> LBO, stride_11 -> SBO for swizzled modes);
 *       ThunderKittens' MN-major 128B descriptor is the same (LBO = rows·128 bytes, SBO
 *       1024, +2048 bytes per k-chunk).
 *
 * Instructions (one warpgroup each; "p" is scale-d: 0 on S's first k-step, D = A·B):
 *   S:  wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {64 f32}, descQ, descK, p, 1, 1, 0, 0;
 *   O:  wgmma.mma_async.sync.aligned.m64n{128|64}k16.f32.bf16.bf16 {64|32 f32}, {4 b32 of P}, descV, p, 1, 1, 1;
 * Ordering: wgmma.fence.sync.aligned before the first wgmma that touches registers
 * written by ordinary instructions (S after the softmax read it, O after the rescale, P
 * after the conversion); wgmma.commit_group.sync.aligned after each product's k-steps;
 * wgmma.wait_group.sync.aligned N before reading results (N = 1 leaves the newest group,
 * P·V, running). Empty asm statements with "+f"/"+r" operands after every wait pin the
 * compiler's reads and writes of those registers after it (cute's
 * warpgroup_fence_operand does the same).
 *
 * Fragments (PTX ISA "Matrix Fragments for wgmma.mma_async.m64nNk16"): thread i of the
 * warpgroup, warp w = i / 32 (of the warpgroup), lane (g = lane / 4, t = lane % 4), owns
 * rows 16w + g and 16w + g + 8 of the m64 tile; accumulator register 4j + 2r + e holds
 * row 16w + g + 8r, column 8j + 2t + e: per 8-column block exactly mma.sync's C fragment.
 * The register A fragment (4 × b32) is mma.m16n8k16's A fragment per warp: registers 0-3
 * hold (row g, k 2t..2t+1), (row g+8, k 2t..), (row g, k 2t+8..), (row g+8, k 2t+8..). So
 * for P·V's k-step kk (keys 16kk..16kk+15 = S columns of blocks 2kk and 2kk+1), register q
 * is bf16x2(s[8kk + 2q], s[8kk + 2q + 1]): P[i] = pack(s[2i], s[2i+1]) over the whole row,
 * the FA2 trick of attention.cu, and P never leaves registers.
 *
 * Pipeline (template OVERLAP = true, the default; FlashAttention-3's intra-warpgroup
 * overlap without its ping-pong between warpgroups):
 *   S_0 = Q·K_0ᵀ; softmax -> P_0
 *   for j = 1..n-1:  issue S_j = Q·K_jᵀ; issue O += P_{j-1}·V_{j-1}
 *                    wait S_j (wait_group 1); softmax(S_j) in fp32 while P·V runs
 *                    wait P·V (wait_group 0); O *= alpha_j; P_j = bf16(S_j)
 *   O += P_{n-1}·V_{n-1}
 * Registers per thread at hd = 128: S 64 f32 + O 64 f32 + P 32 b32. The SASS has this
 * order: the S and P·V HGMMA chains, WARPGROUP.DEPBAR.LE gsb0 1, the softmax's MUFU.EX2,
 * DEPBAR.LE gsb0 0, then the F2FP packs into P's registers. OVERLAP = false runs
 * the plain order (S, softmax, P·V, each waited) for debugging; both are deterministic
 * (fixed order, no atomics). Scores are kept in the log2 domain (scale·log2 e folded into
 * one FFMA, exp = ex2.approx), lse = (m + log2 l)·ln 2, as in attention.cu.
 *
 * What the first GPU run settled: the descriptors (K-major with +32-byte k-steps inside
 * the swizzle atom, N-major V with tnspB = 1, LBO = panel stride, SBO = 1024), the
 * register-A fragment (= mma.m16n8k16's A per warp) and the fences were right as written.
 * Performance: the serial pipeline measured as fast as the overlapped one (hd 128: 358 vs
 * 356 us; hd 64: 239 vs 250 us), so the intra-warpgroup overlap buys nothing while one
 * __syncthreads per key tile keeps both warpgroups in step and all 256 threads issue
 * cp.async copies. Warp specialisation with TMA (attn_fwd_ws) then took hd 128 from ~348
 * to ~240 us; ping-pong did not add to it (STATUS above). What might still pay: three
 * consumer warpgroups (192 queries) at hd 64, where the exponentials (one MUFU op per
 * score, 16 per clock per SM) cost as much time as the tensor cores; emulating part of
 * the exp2 with FMA polynomials (FA4's trick) for the same reason; a TMA store of O. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/cuda/tma.cuh"

#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled */

#include <math.h>

#include <algorithm>


namespace {
namespace sm90 {

constexpr int THREADS = 256;            /* two warpgroups */
constexpr int BM = 128;                 /* queries per block, 64 per warpgroup */
constexpr int BN = 128;                 /* keys per tile */
constexpr int ROW_BYTES = 128;          /* one swizzled panel row: 64 bf16 */
constexpr int PANEL = BM * ROW_BYTES;   /* 128 rows × 64 columns: 16 KiB */
constexpr float LOG2E = 1.4426950408889634f;
static_assert(BM == BN, "the diagonal tile is the last one and the only masked one");

template <int HD> struct cfg {
    static_assert(HD == 64 || HD == 128, "head_dim 64 or 128");
    static constexpr int TILE = (HD / 64) * PANEL;     /* bytes of one 128-row tile */
    static constexpr int SMEM = 5 * TILE + 1024;       /* Q, K×2, V×2, alignment slack */
};

/* Probe: set to 1 by a kernel compiled for sm_90a; the host asks once before launching. */
__device__ int g_probe;
__global__ void probe_kernel() { g_probe = SHLM_WGMMA; }

#if SHLM_WGMMA
using namespace shlm_wgmma;

/* ------------------------------------------------------------------ the steps */

/* Starts copying rows row0..row0+127 (rows >= T become zeros) of one head's columns into
 * a swizzled tile; part of the caller's next cp.async group. Thread tid copies chunk
 * tid % CH of rows tid / CH + k·RSTEP; since RSTEP % 8 == 0 its swizzle phase is fixed. */
template <int HD>
__device__ __forceinline__ void load_tile(uint32_t stile, const bf16 *g, size_t ld, int row0,
                                          int T) {
    constexpr int CH = HD / 8;            /* 16-byte chunks per row */
    constexpr int RSTEP = THREADS / CH;   /* rows per pass */
    static_assert(RSTEP % 8 == 0, "a thread's rows keep one swizzle phase");
    const int c = threadIdx.x % CH, r0 = threadIdx.x / CH;
    const uint32_t dst = stile + (c >> 3) * PANEL + r0 * ROW_BYTES + (((c & 7) ^ (r0 & 7)) << 4);
    const int nvalid = T - row0;
#pragma unroll
    for (int k = 0; k < BM / RSTEP; k++) {
        const int r = r0 + k * RSTEP;
        const bool ok = r < nvalid;
        cp_async16(dst + k * RSTEP * ROW_BYTES, ok ? g + (size_t)(row0 + r) * ld + c * 8 : g, ok);
    }
}

/* S = Q·Kᵀ for this warpgroup's 64 rows and the tile's 128 keys (not committed) */
template <int HD>
__device__ __forceinline__ void gemm_qk(float (&s)[64], uint64_t dq, uint64_t dk) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint32_t off = (kk >> 2) * PANEL + (kk & 3) * 32;
        if (kk == 0) wgmma_ss_n128<0>(s, desc_add(dq, off), desc_add(dk, off));
        else wgmma_ss_n128<1>(s, desc_add(dq, off), desc_add(dk, off));
    }
}

/* O += P·V over the tile's 128 keys (not committed) */
template <int HD>
__device__ __forceinline__ void gemm_pv(float (&o)[HD / 2], const uint32_t (&p)[32], uint64_t dv) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        const uint64_t d = desc_add(dv, kk * 16 * ROW_BYTES);
        if constexpr (HD == 128) wgmma_rs_n128_t(o, &p[4 * kk], d);
        else wgmma_rs_n64_t(o, &p[4 * kk], d);
    }
}

/* Online softmax of one tile, in place: s (raw scores) becomes 2^(s·scale_log2 − m) with
 * m the new running max of each of the thread's two rows; l is rescaled and gains this
 * thread's part of the row sums; alpha = 2^(m_old − m_new) is what O must be scaled by.
 * With MASK (the diagonal tile) columns after lim[r] (the row's offset from the tile's
 * first key) are -inf first. */
template <bool MASK>
__device__ __forceinline__ void softmax_tile(float (&s)[64], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], const int (&lim)[2], int t,
                                             float scale_log2) {
    if (MASK) {
#pragma unroll
        for (int i = 0; i < 64; i++)
            if (8 * (i >> 2) + 2 * t + (i & 1) > lim[(i >> 1) & 1]) s[i] = -INFINITY;
    }
    float mref[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 16; j++) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m[r], mx * scale_log2); /* scale > 0 */
        /* every row sees key 0 in tile 0, so mn is finite; guard anyway */
        mref[r] = mn == -INFINITY ? 0.0f : mn;
        alpha[r] = ex2(m[r] - mref[r]);
        m[r] = mn;
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int r = (i >> 1) & 1;
        s[i] = ex2(fmaf(s[i], scale_log2, -mref[r]));
        l[r] += s[i]; /* this thread's columns; the quad is summed at the end */
    }
}

template <int N>
__device__ __forceinline__ void rescale(float (&o)[N], const float (&alpha)[2]) {
    /* once a row's max settles alpha is exactly 1: skip when it is for the whole warp */
    if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
    for (int i = 0; i < N; i++) o[i] *= alpha[(i >> 1) & 1];
}

__device__ __forceinline__ void to_bf16(uint32_t (&p)[32], const float (&s)[64]) {
#pragma unroll
    for (int i = 0; i < 32; i++) p[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
}

/* every thread: its tile copies have landed and are visible to every thread's wgmma */
__device__ __forceinline__ void tiles_ready() {
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();
}

/* The epilogue of both kernels, part 1: the row sums over the quad, each of the thread's
 * two rows' lse (natural log) written once, and 1/l returned for part 2. */
__device__ __forceinline__ void finish_rows(float (&inv)[2], const float (&m)[2],
                                            const float (&l)[2], float *lse, int b, int h,
                                            int nh, int T, int q0, int wrow, int t) {
    constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lr = l[r];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        inv[r] = 1.0f / lr;
        const int q = q0 + wrow + 8 * r;
        if (t == 0 && q < T) lse[((size_t)b * nh + h) * T + q] = (m[r] + log2f(lr)) * LN2;
    }
}

/* Part 2: O/l as bf16 into this warp's own 16 rows of the staging tile gS (the swizzled
 * panel layout), then 16-byte row stores of those rows (rows >= T skipped). The caller
 * has made sure nothing still reads those staging rows. */
template <int HD>
__device__ __forceinline__ void store_o(unsigned char *gS, const float (&o)[HD / 2],
                                        const float (&inv)[2], bf16 *out, int b, int h, int nh,
                                        int T, int q0, int wrow, int wg, int warp, int lane) {
    constexpr int CH = HD / 8; /* 16-byte chunks per row */
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = wrow + 8 * r; /* row % 8 == g */
            const uint32_t off = (j >> 3) * PANEL + row * ROW_BYTES + (((j & 7) ^ g) << 4) + 4 * t;
            *reinterpret_cast<uint32_t *>(gS + off) =
                pack_bf16(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
        }
    __syncwarp(); /* each warp reads back only its own 16 rows */
    bf16 *const orow = out + (size_t)b * T * nh * HD + (size_t)h * HD;
#pragma unroll
    for (int i = lane; i < 16 * CH; i += 32) {
        const int row = 64 * wg + 16 * warp + i / CH, c = i % CH;
        const uint32_t off = (c >> 3) * PANEL + row * ROW_BYTES + (((c & 7) ^ (row & 7)) << 4);
        if (q0 + row < T)
            *reinterpret_cast<uint4 *>(orow + (size_t)(q0 + row) * nh * HD + c * 8) =
                *reinterpret_cast<const uint4 *>(gS + off);
    }
}
#endif /* SHLM_WGMMA */

/* ------------------------------------------------------------------ the kernel */

template <int HD, bool OVERLAP>
__global__ void __launch_bounds__(THREADS, 1)
    attn_fwd_wgmma(bf16 *out, float *lse, const bf16 *qkv, int T, int nh, int nkv,
                   float scale_log2) {
#if SHLM_WGMMA
    using C = cfg<HD>;
    constexpr int NO = HD / 2; /* O accumulators per thread: 64 × HD over 128 threads */
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    /* swizzle atoms must start on 1024-byte boundaries: align by hand (the slack is in
     * cfg::SMEM), keeping a generic pointer to the same byte for the epilogue */
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sQ = (raw + 1023u) & ~1023u;
    unsigned char *const gQ = smem_raw + (sQ - raw);
    const uint32_t sK = sQ + C::TILE, sV = sQ + 3 * C::TILE; /* K[2], V[2] */

    const int h = blockIdx.x, qt = gridDim.y - 1 - blockIdx.y, b = blockIdx.z;
    const int kvh = h / (nh / nkv);
    const int q0 = qt * BM;
    const size_t C3 = (size_t)(nh + 2 * nkv) * HD;
    const bf16 *const rows = qkv + (size_t)b * T * C3;
    const bf16 *const qg = rows + (size_t)h * HD;
    const bf16 *const kg = rows + (size_t)(nh + kvh) * HD;
    const bf16 *const vg = rows + (size_t)(nh + nkv + kvh) * HD;

    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int wrow = 64 * wg + 16 * warp + g; /* the thread's rows: wrow, wrow + 8 */
    const int n = qt + 1;                     /* key tiles 0..qt */

    /* descriptors of this warpgroup's Q rows and of buffer 0 of K and V */
    const uint64_t dq = make_desc(sQ + 64 * wg * ROW_BYTES, 16, 1024);
    const uint64_t dk0 = make_desc(sK, 16, 1024);
    const uint64_t dv0 = make_desc(sV, PANEL, 1024);
    auto dk = [&](int j) { return desc_add(dk0, (j & 1) * C::TILE); };
    auto dv = [&](int j) { return desc_add(dv0, (j & 1) * C::TILE); };

    float o[NO], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
    uint32_t p[32];
#pragma unroll
    for (int i = 0; i < NO; i++) o[i] = 0.0f;
    const int lim[2] = {wrow, wrow + 8}; /* row offsets from the diagonal tile's first key */

    load_tile<HD>(sQ, qg, C3, q0, T);
    load_tile<HD>(sK, kg, C3, 0, T);
    if constexpr (!OVERLAP) load_tile<HD>(sV, vg, C3, 0, T);
    cp_async_commit();

    if constexpr (OVERLAP) {
        tiles_ready(); /* Q, K_0 */
        if (n > 1) load_tile<HD>(sK + C::TILE, kg, C3, BN, T);
        load_tile<HD>(sV, vg, C3, 0, T);
        cp_async_commit();
        wgmma_fence();
        gemm_qk<HD>(s, dq, dk(0));
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);
        if (n == 1) softmax_tile<true>(s, m, l, alpha, lim, t, scale_log2);
        else softmax_tile<false>(s, m, l, alpha, lim, t, scale_log2);
        to_bf16(p, s);
        for (int j = 1; j < n; j++) {
            tiles_ready(); /* K_j, V_{j-1}; every warp is done with K_{j-1} and V_{j-2} */
            if (j + 1 < n) load_tile<HD>(sK + ((j + 1) & 1) * C::TILE, kg, C3, (j + 1) * BN, T);
            load_tile<HD>(sV + (j & 1) * C::TILE, vg, C3, j * BN, T);
            cp_async_commit();
            wgmma_fence();
            gemm_qk<HD>(s, dq, dk(j));
            wgmma_commit();
            gemm_pv<HD>(o, p, dv(j - 1));
            wgmma_commit();
            wgmma_wait<1>(); /* S_j; P_{j-1}·V_{j-1} may still run */
            reg_fence(s);
            if (j == n - 1) softmax_tile<true>(s, m, l, alpha, lim, t, scale_log2);
            else softmax_tile<false>(s, m, l, alpha, lim, t, scale_log2);
            wgmma_wait<0>(); /* O and P are free */
            reg_fence(o);
            reg_fence(p);
            rescale(o, alpha);
            to_bf16(p, s);
        }
        tiles_ready(); /* V_{n-1} */
        wgmma_fence();
        gemm_pv<HD>(o, p, dv(n - 1));
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(o);
    } else {
        for (int j = 0; j < n; j++) {
            tiles_ready(); /* K_j, V_j; every warp is done with tile j-1's buffers */
            if (j + 1 < n) {
                load_tile<HD>(sK + ((j + 1) & 1) * C::TILE, kg, C3, (j + 1) * BN, T);
                load_tile<HD>(sV + ((j + 1) & 1) * C::TILE, vg, C3, (j + 1) * BN, T);
            }
            cp_async_commit();
            wgmma_fence();
            gemm_qk<HD>(s, dq, dk(j));
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(s);
            reg_fence(o);
            if (j == n - 1) softmax_tile<true>(s, m, l, alpha, lim, t, scale_log2);
            else softmax_tile<false>(s, m, l, alpha, lim, t, scale_log2);
            rescale(o, alpha);
            to_bf16(p, s);
            wgmma_fence();
            gemm_pv<HD>(o, p, dv(j));
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(o);
        }
    }

    float inv[2];
    finish_rows(inv, m, l, lse, b, h, nh, T, q0, wrow, t);
    /* O/l staged in the warpgroup's own Q rows. The barrier: all four warps' products
     * that read these Q rows are done. */
    bar_sync(1 + wg, 128);
    store_o<HD>(gQ, o, inv, out, b, h, nh, T, q0, wrow, wg, warp, lane);
#endif /* SHLM_WGMMA */
}

/* ------------------------------------------------------------------ warp-specialised kernel
 *
 * attn_fwd_ws: the same tiles, steps and numerics as attn_fwd_wgmma's overlapped pipeline
 * (same products in the same order, so the same bits), but the copies move to a producer
 * warpgroup: 384 threads = consumer warpgroups 0 and 1 (warps 0-7, 64 query rows each, as
 * above) + producer warpgroup 2, where warp 8's lane 0 issues every load as TMA
 * (cp.async.bulk.tensor.3d from a CUtensorMap over qkv seen as (column, row t, batch b),
 * encoded on the host for each launch; box 64 columns × 128 rows,
 * SWIZZLE_128B: exactly the panel layout above; rows >= T are zeros). K and V tiles go
 * through a ring of STAGES buffers each, with mbarriers: full (count 1: the producer's
 * arrive.expect_tx of one tile's bytes, completed by the TMA) and empty (count 8: lane 0
 * of each consumer warp arrives once its warpgroup's products reading the buffer are
 * waited for). No __syncthreads after the start. Registers: the launch gives 168 per
 * thread (65536 / 384); setmaxnreg moves the producer warpgroup to 24 and the consumers to
 * 240 (a lone producer warp would not do: warps are spread over the SM's four register
 * files by warp index, so 9 warps cost as much as 12).
 * PINGPONG (FA3's inter-warpgroup schedule): named barriers 3 and 4 make the two consumer
 * warpgroups take turns issuing their products (S_j and P_{j-1}·V_{j-1}), so that one
 * warpgroup's softmax runs while the other's products occupy the tensor cores. Warpgroup 1
 * pre-arrives on warpgroup 0's barrier and skips its arrival after its last turn, so every
 * barrier phase completes and none is left pending at exit.
 * Persistent blocks (SCHED 1, 2 below) also have full / empty mbarriers for Q: the
 * consumers release Q after their last S of a tile, so the next tile's Q loads during the
 * last P·V and the epilogue; O is then staged in a tile of its own (warp-private rows, no
 * barrier), and the K/V ring and its phases run on across tiles. */
constexpr int WS_THREADS = 384;
constexpr int WS_PRODUCER_REGS = 24, WS_CONSUMER_REGS = 240; /* 128·24 + 256·240 <= 65536 */

#if SHLM_WGMMA
using namespace shlm_tma;
#endif

/* SCHED (which tiles a block does): 0 one, from the block index (a grid of them all); 1
 * persistent, static: one block per SM, round k takes the k-th row of a snake over the list
 * of all tiles; 2 persistent, dynamic: the producer takes the next tile of the list from a
 * global counter (atomicAdd) and passes it to the consumers through a 2-slot ring in shared
 * memory (tile_full / tile_empty mbarriers); a block that gets an index past the end
 * stops, and the last block to stop sets the counters back to 0 for the next launch (so no
 * memset and no host state: CUDA-graph safe; but two such launches must not overlap,
 * which the backend's single stream guarantees). The list is longest rows first in both. */
__device__ unsigned int g_tile_next, g_tile_done;

template <int HD, int STAGES, bool PINGPONG, int SCHED>
__global__ void __launch_bounds__(WS_THREADS, 1)
    attn_fwd_ws(bf16 *out, float *lse, const __grid_constant__ CUtensorMap tm, int T, int nh,
                int nkv, int nqt, int B, float scale_log2) {
#if SHLM_WGMMA
    constexpr bool PERSIST = SCHED != 0;
    static_assert(!(PINGPONG && SCHED == 2), "ping-pong needs each block's last tile ahead");
    using C = cfg<HD>;
    constexpr int NO = HD / 2;
    constexpr int NP = HD / 64; /* panels per tile: TMA boxes per tile */
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t bars[6 + 4 * STAGES];
    __shared__ int tile_slot[2];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sQ = (raw + 1023u) & ~1023u;
    /* PERSIST: a separate O staging tile, so that Q is free once the last S is done */
    constexpr int NSTAGE_O = PERSIST ? 1 : 0;
    const uint32_t sO = PERSIST ? sQ + C::TILE : sQ;
    unsigned char *const gO = smem_raw + (sO - raw);
    const uint32_t sK = sQ + (1 + NSTAGE_O) * C::TILE, sV = sK + STAGES * C::TILE;
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(bars);
    const uint32_t fullQ = bar0, emptyQ = bar0 + 8u;
    auto fullK = [&](int s) { return bar0 + 8u * (2 + s); };
    auto fullV = [&](int s) { return bar0 + 8u * (2 + STAGES + s); };
    auto emptyK = [&](int s) { return bar0 + 8u * (2 + 2 * STAGES + s); };
    auto emptyV = [&](int s) { return bar0 + 8u * (2 + 3 * STAGES + s); };
    auto tile_full = [&](int s) { return bar0 + 8u * (2 + 4 * STAGES + s); };
    auto tile_empty = [&](int s) { return bar0 + 8u * (4 + 4 * STAGES + s); };
    const int total = nh * nqt * B;
    auto decode = [&](int w, int &h, int &qt, int &b) {
        const int r = w % (nh * B);
        qt = nqt - 1 - w / (nh * B), h = r % nh, b = r / nh;
    };

    /* the k-th (query tile, head, batch) of this block: one, from the block index, or
     * (PERSIST) round k of a snake over the list of all of them, longest rows first */
    auto tile_at = [&](int k, int &h, int &qt, int &b) -> bool {
        if constexpr (!PERSIST) {
            h = blockIdx.x, qt = gridDim.y - 1 - blockIdx.y, b = blockIdx.z;
            return k == 0;
        } else {
            const int G = gridDim.x;
            const int w = k * G + ((k & 1) ? G - 1 - (int)blockIdx.x : (int)blockIdx.x);
            if (w >= total) return false;
            decode(w, h, qt, b);
            return true;
        }
    };
    const int lane = threadIdx.x & 31, warp_all = threadIdx.x >> 5;

    if (threadIdx.x == 0) {
        mbar_init(fullQ, 1);
        mbar_init(emptyQ, 8);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(fullK(s), 1);
            mbar_init(fullV(s), 1);
            mbar_init(emptyK(s), 8);
            mbar_init(emptyV(s), 8);
        }
        for (int s = 0; s < 2; s++) {
            mbar_init(tile_full(s), 1);
            mbar_init(tile_empty(s), 8);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (warp_all >= 8) { /* the producer warpgroup: warp 8's lane 0 issues every load */
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        if (warp_all == 8 && lane == 0) {
            tma_prefetch_desc(&tm);
            int it = 0; /* K/V tiles issued so far: ring slot it % STAGES, use it / STAGES */
            int h, qt, b;
            /* the k-th tile: SCHED 2 takes it from the counter and publishes it */
            auto next = [&](int k) -> bool {
                if constexpr (SCHED == 2) {
                    if (k >= 2) mbar_wait(tile_empty(k & 1), ((k >> 1) - 1) & 1);
                    const int w = (int)atomicAdd(&g_tile_next, 1u);
                    *(volatile int *)&tile_slot[k & 1] = w;
                    mbar_arrive(tile_full(k & 1)); /* release: the slot is written */
                    if (w >= total) return false;
                    decode(w, h, qt, b);
                    return true;
                } else {
                    return tile_at(k, h, qt, b);
                }
            };
            for (int k = 0; next(k); k++) {
                const int kvh = h / (nh / nkv);
                const int cq = h * HD, ck = (nh + kvh) * HD, cv = (nh + nkv + kvh) * HD;
                if (k > 0) mbar_wait(emptyQ, (k - 1) & 1);
                mbar_arrive_expect_tx(fullQ, C::TILE);
#pragma unroll
                for (int p = 0; p < NP; p++)
                    tma_load_3d(sQ + p * PANEL, &tm, fullQ, cq + 64 * p, qt * BM, b);
                for (int j = 0; j <= qt; j++, it++) {
                    const int st = it % STAGES, u = it / STAGES;
                    if (u > 0) mbar_wait(emptyK(st), (u - 1) & 1);
                    mbar_arrive_expect_tx(fullK(st), C::TILE);
#pragma unroll
                    for (int p = 0; p < NP; p++)
                        tma_load_3d(sK + st * C::TILE + p * PANEL, &tm, fullK(st), ck + 64 * p,
                                    j * BN, b);
                    if (u > 0) mbar_wait(emptyV(st), (u - 1) & 1);
                    mbar_arrive_expect_tx(fullV(st), C::TILE);
#pragma unroll
                    for (int p = 0; p < NP; p++)
                        tma_load_3d(sV + st * C::TILE + p * PANEL, &tm, fullV(st), cv + 64 * p,
                                    j * BN, b);
                }
            }
            if constexpr (SCHED == 2) {
                /* this block takes no more tiles; the last to get here resets the counters
                 * (every block's fetches come before its increment of g_tile_done) */
                __threadfence();
                if (atomicAdd(&g_tile_done, 1u) == gridDim.x - 1) {
                    atomicExch(&g_tile_next, 0u);
                    atomicExch(&g_tile_done, 0u);
                }
            }
        }
        return;
    }

    /* the consumers */
    setmaxnreg_inc<WS_CONSUMER_REGS>();
    const int wg = warp_all >> 2, warp = warp_all & 3;
    const int g = lane >> 2, t = lane & 3;
    const int wrow = 64 * wg + 16 * warp + g;
    const uint64_t dq = make_desc(sQ + 64 * wg * ROW_BYTES, 16, 1024);
    const uint64_t dk0 = make_desc(sK, 16, 1024);
    const uint64_t dv0 = make_desc(sV, PANEL, 1024);
    /* ring slots and phases by the running K/V tile count i */
    auto dk = [&](int i) { return desc_add(dk0, (i % STAGES) * C::TILE); };
    auto dv = [&](int i) { return desc_add(dv0, (i % STAGES) * C::TILE); };
    auto par = [&](int i) { return (uint32_t)((i / STAGES) & 1); };
    /* this warp is done with a buffer (its warpgroup's products reading it were waited for) */
    auto release = [&](uint32_t bar) { mbar_arrive_if(bar, lane == 0); };
    /* ping-pong turns: sync on our own barrier, arrive on the other's */
    auto turn_begin = [&]() {
        if constexpr (PINGPONG) bar_sync(3 + wg, 256);
    };
    /* last: the block's last turn, after which warpgroup 1 does not arrive */
    auto turn_end = [&](bool last) {
        if constexpr (PINGPONG) bar_arrive_if(3 + (wg ^ 1), 256, wg == 0 || !last);
    };
    const int lim[2] = {wrow, wrow + 8}; /* row offsets from the diagonal tile's first key */

    if constexpr (PINGPONG) {
        if (wg == 1) bar_arrive(3, 256); /* warpgroup 0 takes the first turn */
    }
    int i0 = 0; /* K/V tiles consumed before this query tile */
    int h, qt, b;
    auto next = [&](int k) -> bool {
        if constexpr (SCHED == 2) {
            mbar_wait(tile_full(k & 1), (k >> 1) & 1);
            const int w = *(volatile int *)&tile_slot[k & 1];
            __syncwarp();
            release(tile_empty(k & 1));
            if (w >= total) return false;
            decode(w, h, qt, b);
            return true;
        } else {
            return tile_at(k, h, qt, b);
        }
    };
    for (int k = 0; next(k); k++) {
        const int q0 = qt * BM, n = qt + 1;
        bool last_tile = true;
        if constexpr (SCHED == 1) {
            last_tile = !tile_at(k + 1, h, qt, b);
            tile_at(k, h, qt, b); /* tile_at(k + 1) overwrote them */
        }
        float o[NO], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
        uint32_t p[32];
#pragma unroll
        for (int i = 0; i < NO; i++) o[i] = 0.0f;

        mbar_wait(fullQ, k & 1);
        mbar_wait(fullK(i0 % STAGES), par(i0));
        turn_begin();
        wgmma_fence();
        gemm_qk<HD>(s, dq, dk(i0));
        wgmma_commit();
        turn_end(last_tile && n == 1);
        wgmma_wait<0>();
        reg_fence(s);
        release(emptyK(i0 % STAGES));
        if constexpr (PERSIST) mbar_arrive_if(emptyQ, lane == 0 && n == 1);
        if (n == 1) softmax_tile<true>(s, m, l, alpha, lim, t, scale_log2);
        else softmax_tile<false>(s, m, l, alpha, lim, t, scale_log2);
        to_bf16(p, s);
        for (int j = 1; j < n; j++) {
            const int i = i0 + j;
            /* both waits first: a loop between the two products would make ptxas insert a
             * warpgroup.arrive before the second (V_{j-1} was loaded before K_j anyway) */
            mbar_wait(fullK(i % STAGES), par(i));
            mbar_wait(fullV((i - 1) % STAGES), par(i - 1));
            turn_begin();
            wgmma_fence();
            gemm_qk<HD>(s, dq, dk(i));
            wgmma_commit();
            gemm_pv<HD>(o, p, dv(i - 1));
            wgmma_commit();
            turn_end(last_tile && j == n - 1);
            wgmma_wait<1>(); /* S_j */
            reg_fence(s);
            release(emptyK(i % STAGES));
            if constexpr (PERSIST) mbar_arrive_if(emptyQ, lane == 0 && j == n - 1);
            if (j == n - 1) softmax_tile<true>(s, m, l, alpha, lim, t, scale_log2);
            else softmax_tile<false>(s, m, l, alpha, lim, t, scale_log2);
            wgmma_wait<0>(); /* P_{j-1}·V_{j-1} */
            reg_fence(o);
            reg_fence(p);
            release(emptyV((i - 1) % STAGES));
            rescale(o, alpha);
            to_bf16(p, s);
        }
        {
            const int i = i0 + n - 1;
            mbar_wait(fullV(i % STAGES), par(i));
            wgmma_fence();
            gemm_pv<HD>(o, p, dv(i));
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(o);
            release(emptyV(i % STAGES));
        }
        i0 += n;

        float inv[2];
        finish_rows(inv, m, l, lse, b, h, nh, T, q0, wrow, t);
        /* O/l staged in this warp's own 16 rows of the staging tile (the warpgroup's Q rows
         * unless PERSIST: then the barrier waits for all four warps' products reading them) */
        if constexpr (!PERSIST) bar_sync(1 + wg, 128);
        store_o<HD>(gO, o, inv, out, b, h, nh, T, q0, wrow, wg, warp, lane);
        __syncwarp(); /* the next tile's staging writes come after these reads */
    }
#endif /* SHLM_WGMMA */
}

/* ------------------------------------------------------------------ host side */

/* 1: this process's device is compute capability 9.0 and the sm_90a code is in the
 * binary (the probe ran it); asked once per process (one device per process). */
bool usable() {
    static int state = -1;
    if (state >= 0) return state == 1;
    state = 0;
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return false;
    if (major != 9 || minor != 0) return false; /* sm_90a code runs on 9.0 only */
    cudaStream_t st = shlm_cuda_stream();
    int ok = 0;
    probe_kernel<<<1, 1, 0, st>>>();
    if (cudaGetLastError() != cudaSuccess) return false; /* e.g. no image for this device */
    shlm_cuda_host_wait(st);
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(&ok, g_probe, sizeof ok, 0, cudaMemcpyDeviceToHost, st));
    shlm_cuda_host_wait(st);
    state = ok == 1;
    return state == 1;
}

template <int HD, bool OVERLAP>
void launch(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int nh, int nkv) {
    static bool done = false;
    if (!done) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_wgmma<HD, OVERLAP>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, cfg<HD>::SMEM));
        done = true;
    }
    const float scale_log2 = (float)(1.0 / sqrt((double)HD)) * LOG2E;
    dim3 grid(nh, (T + BM - 1) / BM, B);
    attn_fwd_wgmma<HD, OVERLAP><<<grid, THREADS, cfg<HD>::SMEM, shlm_cuda_stream()>>>(
        out, lse, qkv, T, nh, nkv, scale_log2);
    CUDA_CHECK_LAST();
}

template <int HD, int STAGES, bool PINGPONG, int SCHED>
bool launch_ws(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int nh, int nkv) {
    constexpr bool PERSIST = SCHED != 0;
    constexpr int SMEM = (1 + (PERSIST ? 1 : 0) + 2 * STAGES) * cfg<HD>::TILE + 1024;
    /* qkv as (column, row t < T, batch b < B), boxes of 64 columns x BN rows: one panel
     * of the kernels' layout per load; false when the driver cannot make it */
    CUtensorMap map;
    if (!shlm_tma_host::make_map_bf16_3d(&map, qkv, (size_t)(nh + 2 * nkv) * HD, T, B, BN))
        return false;
    static bool done = false;
    if (!done) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_ws<HD, STAGES, PINGPONG, SCHED>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
        done = true;
    }
    const float scale_log2 = (float)(1.0 / sqrt((double)HD)) * LOG2E;
    const int nqt = (T + BM - 1) / BM;
    dim3 grid(nh, nqt, B);
    if (PERSIST) {
        const long tiles = (long)nh * nqt * B;
        if (tiles > 0x7fffffffL) return false;
        grid = dim3((unsigned)std::min<long>(tiles, shlm_cuda_sm_count()), 1, 1);
    }
    attn_fwd_ws<HD, STAGES, PINGPONG, SCHED><<<grid, WS_THREADS, SMEM, shlm_cuda_stream()>>>(
        out, lse, map, T, nh, nkv, nqt, B, scale_log2);
    CUDA_CHECK_LAST();
    return true;
}

/* The pipelines (shlm_cuda_attention_fwd_sm90_variant's numbers):
 *   0  attn_fwd_wgmma, overlapped (cp.async by all 256 threads)
 *   1  attn_fwd_wgmma, serial
 *   2  attn_fwd_ws, 2 stages          3  attn_fwd_ws, 2 stages, ping-pong
 *   4  attn_fwd_ws, 3 stages          5  attn_fwd_ws, 3 stages, ping-pong
 *   6  attn_fwd_ws persistent (static), 2 stages   7  the same with ping-pong
 *   8  attn_fwd_ws persistent, dynamic tile counter, 2 stages
 * A TMA pipeline (2-5) returns 1 when the driver cannot encode the tensor map. */
constexpr int N_VARIANTS = 9;
/* the default (see the top of the file): persistent with the dynamic counter when the
 * tiles fill more than one wave of blocks, else one block per tile */
constexpr int DEFAULT_VARIANT_MANY = 8, DEFAULT_VARIANT_FEW = 2;

template <int HD>
bool launch_variant(int variant, bf16 *o, float *lse, const bf16 *x, int B, int T, int nh, int nkv) {
    switch (variant) {
    case 0: launch<HD, true>(o, lse, x, B, T, nh, nkv); return true;
    case 1: launch<HD, false>(o, lse, x, B, T, nh, nkv); return true;
    case 2: return launch_ws<HD, 2, false, 0>(o, lse, x, B, T, nh, nkv);
    case 3: return launch_ws<HD, 2, true, 0>(o, lse, x, B, T, nh, nkv);
    case 4: return launch_ws<HD, 3, false, 0>(o, lse, x, B, T, nh, nkv);
    case 5: return launch_ws<HD, 3, true, 0>(o, lse, x, B, T, nh, nkv);
    case 6: return launch_ws<HD, 2, false, 1>(o, lse, x, B, T, nh, nkv);
    case 7: return launch_ws<HD, 2, true, 1>(o, lse, x, B, T, nh, nkv);
    case 8: return launch_ws<HD, 2, false, 2>(o, lse, x, B, T, nh, nkv);
    default: return false;
    }
}

/* variant < 0: the default for hd, falling back to 0 if it cannot run */
int forward(void *out, float *lse, const void *qkv, int B, int T, int nh, int nkv, int hd,
            int variant) {
    if (B <= 0 || T <= 0 || nh <= 0 || nkv <= 0 || nh % nkv != 0) return 1;
    if (hd != 64 && hd != 128) return 1;
    if ((T + BM - 1) / BM > 65535 || B > 65535 || nh > 65535) return 1; /* grid limits */
    if (!shlm_aligned(qkv, 16) || !shlm_aligned(out, 16) || !shlm_aligned(lse, 4)) return 1;
    if (variant >= N_VARIANTS) return 1;
    if (!usable()) return 1;
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)qkv;
    const bool dflt = variant < 0;
    if (dflt)
        variant = (long)nh * ((T + BM - 1) / BM) * B > shlm_cuda_sm_count() ? DEFAULT_VARIANT_MANY
                                                                              : DEFAULT_VARIANT_FEW;
    bool ok = hd == 128 ? launch_variant<128>(variant, o, lse, x, B, T, nh, nkv)
                        : launch_variant<64>(variant, o, lse, x, B, T, nh, nkv);
    if (!ok && dflt)
        ok = hd == 128 ? launch_variant<128>(0, o, lse, x, B, T, nh, nkv)
                       : launch_variant<64>(0, o, lse, x, B, T, nh, nkv);
    return ok ? 0 : 1;
}

} // namespace sm90
} // namespace

/* 0: done (out and lse written, queued on the backend's stream); 1: not handled (shape,
 * alignment, device or build), nothing queued: the caller runs attention.cu's kernel. */
extern "C" int shlm_cuda_attention_fwd_sm90(void *out, float *lse, const void *qkv, int B, int T,
                                            int nh, int nkv, int hd) {
    return sm90::forward(out, lse, qkv, B, T, nh, nkv, hd, -1);
}

/* 1 when this process's device can run the sm_90a kernels (this file's and
 * attention_bwd_sm90.cu's): compute capability 9.0 and the sm_90a image in the binary. */
extern "C" int shlm_cuda_sm90_usable(void) { return sm90::usable() ? 1 : 0; }

/* The same with the pipeline chosen (numbers: see sm90::forward; 0..8, -1 the default);
 * for tests/gpu/attn_sm90_check.cu, which checks and times every one. */
extern "C" int shlm_cuda_attention_fwd_sm90_variant(void *out, float *lse, const void *qkv, int B,
                                                    int T, int nh, int nkv, int hd, int variant) {
    return sm90::forward(out, lse, qkv, B, T, nh, nkv, hd, variant);
}
