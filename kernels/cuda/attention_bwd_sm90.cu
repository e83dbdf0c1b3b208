/* cuda backend: the causal grouped-query flash attention backward's two heavy passes for
 * Hopper (sm_90a) on warpgroup MMA (wgmma.mma_async, bf16 operands, fp32 accumulation):
 *  - dK/dV (and dS), attn_bwd_dkv_ws: the contract of attn_bwd_dkv_kernel in
 *    attention.cu (read the comments above it and above bwd_scratch_layout): same inputs,
 *    writes the dk and dv rows of dqkv and the dS scratch in exactly the same fragment
 *    layout, so either dQ kernel can follow it;
 *  - dQ = dS·K, attn_bwd_dq_wgmma: the contract of attn_bwd_dq_kernel, reading that
 *    scratch.
 * head_dim 64 and 128 only; the caller (attention.cu's bwd_launch) runs the portable
 * mma.sync kernel of a pass, the declared fallback, whenever the entry point returns 1
 * (shape, alignment, device, build, or a tensor map the driver cannot encode). Both give
 * the same bits as the mma.sync kernels: the same products in the same order, the same
 * k-steps of 16, the same fp32 formulas (checked by tests/gpu/attn_bwd_sm90_check.cu).
 * Measured on an H200 (B=1, T=4096, 32 heads, causal, whole backward with D): hd 128
 * 778 us, hd 64 514 us, against 1409 and 1016 us on the mma.sync kernels (with 512-token
 * documents 193 and 134 us against 291 and 213); the dQ pass fed by TMA and bulk copies
 * from producer warps was faster alone but gained nothing in the whole backward, and
 * dK/dV with one warpgroup per block, three Q/dO buffers or a fixed issue order between
 * the warpgroups were slower.
 *
 * Block of the dK/dV pass = (kv head, 128-key tile kt, batch element b0 + z); consumer
 * warpgroup wg owns keys k0 + 64·wg .. + 63, one m64 wgmma tile, and keeps dK and dV of
 * those keys in registers (m64n{hd} fp32 each). The block visits every query head of the
 * GQA group and every 64-query step at or after k0 (head-major, then query steps: the
 * order of attn_bwd_dkv_kernel), so each dk/dv row has one writer summing in a fixed
 * order. Per step and warpgroup (rows = keys, columns = the step's 64 queries):
 *   Sᵀ  = K_wg·Qᵀ            ss m64n64k16 × hd/16, A = K rows (K-major), B = Q (K-major)
 *   dPᵀ = V_wg·dOᵀ           ss m64n64k16 × hd/16, A = V rows, B = dO (both K-major)
 *   Pᵀ  = 2^(Sᵀ·scale·log2 e − lse·log2 e), 0 where key > query (diagonal steps)
 *   dV += Pᵀ·dO              rs m64n{hd}k16 × 4, A = bf16 Pᵀ in registers, B = dO N-major
 *   dSᵀ = Pᵀ∘(dPᵀ − D)·scale (fp32 Pᵀ, as attn_bwd_dkv_kernel)
 *   dK += dSᵀ·Q              rs m64n{hd}k16 × 4, A = bf16 dSᵀ in registers, B = Q N-major
 * and the bf16 dSᵀ register fragments go to the scratch as they are: warp w of warpgroup
 * wg holds keys 16(4wg + w).. (key block kk = 4wg + w), and its register-A fragment for
 * the k-step over queries 16qm.. is mma.m16n8k16's A fragment of those 16 keys × 16
 * queries, i.e. exactly fragment kk·4 + qm of the dS tile, one 16-byte store per lane in
 * lane order. A warpgroup whose keys all follow the step's queries (wg 1 on the first
 * query step of a head) skips the step and stores nothing: the dQ kernels read a fragment
 * only when its first key is at or before the reading warp's last query, never for such
 * a step. Keys past T come in as zero rows, are masked on the diagonal steps (the only
 * steps that can hold them) and are never stored; queries past T get lse = +inf (P = 0),
 * D = 0 and zero Q/dO rows. Documents (DOC, doc_start non-NULL; attention_doc.cuh): the
 * steps of a head end with the last one that starts before doc_query_end of the tile's
 * last key, and Pᵀ is 0 where a key precedes its query's first key (one per query, in the
 * slot beside lse and D); DOC = false is the plain causal kernel, unchanged.
 *
 * Shared memory, every tile in the 128-byte-swizzled 64-column panels of
 * attention_sm90.cu (chunk c of row r at c ^ (r % 8); a panel of R rows is R·128 bytes,
 * 1024-aligned): K, V [128][hd] (panels of 16 KiB), Q[NS], dO[NS] [64][hd] (panels of 8
 * KiB), lse·log2 e and D [NS][64] fp32. Descriptors as in attention_sm90.cu: K-major LBO
 * 16, SBO 1024, k-step kk at (kk / 4)·PANEL + (kk % 4)·32 bytes; N-major (tnspB = 1) LBO
 * = the panel stride, SBO 1024, k-step of 16 rows = +2048 bytes. dK and dV leave through
 * the warpgroup's own K and V rows (nobody else reads them), staged in the same layout,
 * as 16-byte row stores.
 *
 * dQ (attn_bwd_dq_wgmma) has its own comment further down. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/attention_doc.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/cuda/tma.cuh"

#include <math.h>

namespace {
namespace sm90b {

constexpr int WG_THREADS = 128;        /* one warpgroup */
constexpr int BK = 128;                /* keys per dS tile, 64 per warpgroup */
constexpr int BQ = 64;                 /* queries per step */
constexpr int ROW_BYTES = 128;         /* one swizzled panel row: 64 bf16 */
constexpr int KPANEL = BK * ROW_BYTES; /* 16 KiB */
constexpr int QPANEL = BQ * ROW_BYTES; /* 8 KiB */
constexpr int DS_TILE = BK * BQ;       /* elements of one dS tile (attention.cu) */
constexpr int DS_FRAG = 256;           /* elements of one 16×16 fragment */
constexpr float LOG2E = 1.4426950408889634f;

/* the dK/dV pass's shared memory: K, V of the block's 128 keys; NS slots of Q, dO, lse, D
 * (and DOC: the queries' first keys) */
template <int HD, bool DOC> struct cfg {
    static_assert(HD == 64 || HD == 128, "head_dim 64 or 128");
    static constexpr int NS = 3;                    /* ring slots (Q/dO steps in flight) */
    static constexpr int KPAN = BK * ROW_BYTES;     /* K, V panel */
    static constexpr int KTILE = (HD / 64) * KPAN;
    static constexpr int QTILE = (HD / 64) * QPANEL;
    static constexpr int VEC = (DOC ? 3 : 2) * NS * BQ * 4; /* lse, D (, lo): [NS][64] each */
    static constexpr int SMEM = 2 * KTILE + 2 * NS * QTILE + VEC + 1024;
};

/* attention.cu's ds_tile_base: dS tiles of query tiles (of 64) 0..Q-1 */
__host__ __device__ __forceinline__ size_t ds_tile_base(int Q) {
    const size_t m = (size_t)(Q >> 1);
    return (Q & 1) ? (m + 1) * (m + 1) : m * (m + 1);
}

#if SHLM_WGMMA
using namespace shlm_wgmma;

/* Starts copying rows row0..row0+ROWS-1 (rows >= T become zeros) of one head's columns
 * into a swizzled tile with panels of ROWS rows; part of the caller's next cp.async group. */
template <int HD, int ROWS, int NT>
__device__ __forceinline__ void load_tile(uint32_t stile, const bf16 *g, size_t ld, int row0,
                                          int T) {
    constexpr int CH = HD / 8;
    constexpr int RSTEP = NT / CH;
    constexpr int PANEL = ROWS * ROW_BYTES;
    static_assert(RSTEP % 8 == 0 && ROWS % RSTEP == 0, "a thread's rows keep one swizzle phase");
    const int c = threadIdx.x % CH, r0 = threadIdx.x / CH;
    const uint32_t dst = stile + (c >> 3) * PANEL + r0 * ROW_BYTES + (((c & 7) ^ (r0 & 7)) << 4);
    const int nvalid = T - row0;
#pragma unroll
    for (int k = 0; k < ROWS / RSTEP; k++) {
        const int r = r0 + k * RSTEP;
        const bool ok = r < nvalid;
        cp_async16(dst + k * RSTEP * ROW_BYTES, ok ? g + (size_t)(row0 + r) * ld + c * 8 : g, ok);
    }
}

/* X = A·Bᵀ over the head dim: A the warpgroup's 64 key rows (K or V, K-major, panels of
 * APAN bytes), B the step's 64 query rows (Q or dO, K-major, panels of 64 rows) */
template <int HD, int APAN>
__device__ __forceinline__ void gemm_kq(float (&x)[32], uint64_t da, uint64_t db) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint64_t a = desc_add(da, (kk >> 2) * APAN + (kk & 3) * 32);
        const uint64_t b = desc_add(db, (kk >> 2) * QPANEL + (kk & 3) * 32);
        if (kk == 0) wgmma_ss_n64<0>(x, a, b);
        else wgmma_ss_n64<1>(x, a, b);
    }
}

/* acc += X·B over the step's 64 queries: X in registers (bf16 A fragments), B the query
 * rows (dO or Q) read N-major (tnspB = 1) */
template <int HD>
__device__ __forceinline__ void gemm_acc(float (&acc)[HD / 2], const uint32_t (&x)[16],
                                         uint64_t db) {
#pragma unroll
    for (int kq = 0; kq < BQ / 16; kq++) {
        const uint64_t d = desc_add(db, kq * 16 * ROW_BYTES);
        if constexpr (HD == 128) wgmma_rs_n128_t(acc, &x[4 * kq], d);
        else wgmma_rs_n64_t(acc, &x[4 * kq], d);
    }
}

/* this thread's copies but the newest PENDING groups have landed; after the barrier every
 * thread's have, visible to wgmma too */
template <int PENDING> __device__ __forceinline__ void tiles_ready() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
    fence_proxy_async();
    __syncthreads();
}

/* The inverse RoPE rotation (ops.h rope with inverse = 1, Hugging Face rotate-half) of a
 * warpgroup's m64n{HD} fp32 accumulator tile, in registers, before its one rounding to
 * bf16: turns the gradient w.r.t. the post-RoPE q or k rows into the one w.r.t. the
 * pre-RoPE rows. C-fragment layout: register 4j + 2r + e of lane (g, t) of warp w holds
 * row 16w + g + 8r, column 8j + 2t + e; so column f < HD/2 and its partner f + HD/2 are
 * registers j and j + HD/16 of the same thread, and the thread's frequencies are
 * f = 8j + 2t + e. pos0: the sequence position of the thread's rows with r = 0 (r = 1 is
 * pos0 + 8); rows at or past T (never stored; the table has T positions) are left as
 * they are. tab: rope.cu's table, float2 (cos, sin) of pos·freq[f] (ops.h rope) at
 * [pos·HD/2 + f], 16-byte aligned. For a = column f, b = column f + HD/2:
 *   a' = a·cos + b·sin,  b' = b·cos − a·sin.
 * Shared by every wgmma kernel that stores dq or dk (the dK/dV and dQ epilogues); a new
 * kernel that stores dk or dq must apply it too, or decline when given a table.
 * Measured: the fused rotation adds 22 us to an 866 us backward at T 4096 where the
 * separate inverse pass took 48 us. */
template <int HD>
__device__ __forceinline__ void rope_inv_acc(float (&acc)[HD / 2], const float2 *__restrict__ tab,
                                             int pos0, int T, int t) {
    constexpr int J = HD / 16; /* register blocks per half */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int pos = pos0 + 8 * r;
        if (pos >= T) continue;
        /* frequencies 8j + 2t and 8j + 2t + 1: one 16-byte load of (cos, sin, cos, sin) */
        const float4 *const cs =
            reinterpret_cast<const float4 *>(tab + (size_t)pos * (HD / 2) + 2 * t);
#pragma unroll
        for (int j = 0; j < J; j++) {
            const float4 w = __ldg(cs + 4 * j);
            float &a0 = acc[4 * j + 2 * r], &b0 = acc[4 * (j + J) + 2 * r];
            float &a1 = acc[4 * j + 2 * r + 1], &b1 = acc[4 * (j + J) + 2 * r + 1];
            const float x0 = a0, y0 = b0, x1 = a1, y1 = b1;
            /* explicit roundings: the same bits in every kernel that inlines this,
             * whatever the compiler would contract */
            a0 = __fmaf_rn(x0, w.x, __fmul_rn(y0, w.y));
            b0 = __fmaf_rn(y0, w.x, -__fmul_rn(x0, w.y));
            a1 = __fmaf_rn(x1, w.z, __fmul_rn(y1, w.w));
            b1 = __fmaf_rn(y1, w.z, -__fmul_rn(x1, w.w));
        }
    }
}

/* dK and dV of the warpgroup's 64 keys (fp32 m64n{hd} accumulators, the C fragment: lane
 * (g, t) of warp w holds rows 16w + g, 16w + g + 8 and columns 8j + 2t, 8j + 2t + 1 in
 * registers 4j + 2r + e) into the dk and dv rows of dqkv (rows = batch element b's keys
 * kb0.., kb0 + row < T only), staged as bf16 through the warpgroup's own K and V rows of
 * shared memory (gbase: the K tile, the V tile KTILE bytes on; same swizzled panels) and
 * written as 16-byte row stores. The caller has waited for every product of the
 * warpgroup; the barrier here makes that hold for all four warps before the K/V rows are
 * overwritten. The caller has applied the inverse RoPE to dk (rope_inv_acc) where asked. */
template <int HD, int KPAN, int KTILE>
__device__ __forceinline__ void dkv_store(unsigned char *gbase, const float (&dk)[HD / 2],
                                          const float (&dv)[HD / 2], bf16 *dqkv, int b, int T,
                                          int kb0, size_t C3, int nh, int nkv, int kvh, int wl,
                                          int warp, int lane) {
    constexpr int CH = HD / 8;
    const int g = lane >> 2, t = lane & 3;
    bar_sync(1 + wl, 128);
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = 64 * wl + 16 * warp + g + 8 * r; /* row % 8 == g */
            const uint32_t off = (j >> 3) * KPAN + row * ROW_BYTES + (((j & 7) ^ g) << 4) + 4 * t;
            *reinterpret_cast<uint32_t *>(gbase + off) =
                pack_bf16(dk[4 * j + 2 * r], dk[4 * j + 2 * r + 1]);
            *reinterpret_cast<uint32_t *>(gbase + KTILE + off) =
                pack_bf16(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
        }
    __syncwarp(); /* each warp reads back only its own 16 rows */
    bf16 *const rows = dqkv + ((size_t)b * T + kb0) * C3;
#pragma unroll
    for (int i = lane; i < 16 * CH; i += 32) {
        const int row = 64 * wl + 16 * warp + i / CH, c = i % CH;
        const uint32_t off = (c >> 3) * KPAN + row * ROW_BYTES + (((c & 7) ^ (row & 7)) << 4);
        if (kb0 + row < T) {
            bf16 *const dst = rows + (size_t)row * C3 + c * 8;
            *reinterpret_cast<uint4 *>(dst + (size_t)(nh + kvh) * HD) =
                *reinterpret_cast<const uint4 *>(gbase + off);
            *reinterpret_cast<uint4 *>(dst + (size_t)(nh + nkv + kvh) * HD) =
                *reinterpret_cast<const uint4 *>(gbase + KTILE + off);
        }
    }
}
#endif /* SHLM_WGMMA */

/* ------------------------------------------------------------------ dK/dV
 *
 * attn_bwd_dkv_ws: 384 threads = consumer warpgroups 0 and 1 (warps 0-7, keys k0 + 64·wg..)
 * + producer warpgroup 2, of which warp 8 alone works, as attention_sm90.cu's attn_fwd_ws
 * (setmaxnreg: producer 24 registers, consumers 240; 9 warps would cost the register file
 * as much as 12).
 *  - K and V (the block's 128 rows, once): TMA boxes of 64 columns × 128 rows over qkv
 *    (tensor map tm_kv) on one mbarrier kv_full (count 1, expect_tx 2·KTILE);
 *  - per step s (head-major, then 64-query steps from k0), ring slot s % NS: Q (tm_q over
 *    qkv) and dO (tm_o over dout), boxes of 64 columns × 64 rows; the 128-byte swizzle of
 *    the maps is the panel layout of this file; rows past T arrive as zeros (TMA's
 *    out-of-bounds fill). lse·log2 e and D of the step's 64 queries are written into the
 *    slot by warp 8's 32 lanes with plain loads (issued before the wait for the slot) and
 *    stores (+inf and 0 past T). full[slot] has count 32: lane 0 first announces the two
 *    tiles' bytes (mbarrier.expect_tx, no arrival) and issues their TMA, then every lane
 *    arrives after its own lse / D stores (release); empty[slot] has count 8: lane 0 of
 *    every consumer warp, after a __syncwarp, once its warpgroup's products reading the
 *    slot were waited for (predicated arrive, no branch).
 *  - A warpgroup skips the steps whose queries all precede its keys (warpgroup 1 on the
 *    first step of a head) and stores no dS for them, but still waits for each such step's
 *    full phase before it releases the slot, so that no warp arrives twice on one phase of
 *    an empty barrier (with nqt = 1 warpgroup 1 skips every step). The skips happen only
 *    where nothing is in flight (see the loop).
 * Schedule per warpgroup (FA3's order; j = step, dV_j = dV += Pᵀ_j·dO_j, dK_j = dK +=
 * dSᵀ_j·Q_j): top of step j: wait all (dV_{j-1}, dK_{j-1}, Sᵀ_j), release slot j - 1,
 * issue dPᵀ_j; exp into fp32 Pᵀ while dPᵀ runs; wait dPᵀ; bf16 Pᵀ and dSᵀ, dS stores;
 * issue dV_j and dK_j; wait for slot j + 1, issue Sᵀ_{j+1}. Nothing is waited for between
 * dV_j, dK_j and Sᵀ_{j+1}; bf16 Pᵀ never lives beside fp32 Pᵀ, dPᵀ and dSᵀ, which is what
 * lets hd 128 fit in 240 registers. Each accumulator takes its k-steps and steps in the
 * order of attn_bwd_dkv_kernel, whatever the issue order. Pᵀ and dSᵀ are computed into
 * fresh registers, never in place into Sᵀ / dPᵀ: those are loop-carried, and a
 * non-wgmma write to them makes ptxas serialise every wgmma (C7515).
 * tests/gpu/attn_bwd_ws_model.py models the steps and the mbarrier protocol. */
constexpr int DKV_WS_THREADS = 384;
constexpr int DKV_WS_PRODUCER_REGS = 24, DKV_WS_CONSUMER_REGS = 240; /* 128·24 + 256·240 <= 65536 */

template <int HD, bool DOC>
__global__ void __launch_bounds__(DKV_WS_THREADS, 1)
    attn_bwd_dkv_ws(bf16 *dqkv, bf16 *dS, size_t ds_head, const float *lse, const float *Dv,
                    const __grid_constant__ CUtensorMap tm_kv, const __grid_constant__ CUtensorMap tm_q,
                    const __grid_constant__ CUtensorMap tm_o, int b0, int T, int nh, int nkv,
                    float scale, float scale_log2, const float2 *rope, const int32_t *doc) {
#if SHLM_WGMMA
    using namespace shlm_tma;
    using C = cfg<HD, DOC>;
    constexpr int NS = C::NS;
    constexpr int NA = HD / 2; /* dK or dV accumulators per thread */
    constexpr int NP = HD / 64; /* 64-column panels per tile: TMA boxes per tile */
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t bars[1 + 2 * NS];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sK = (raw + 1023u) & ~1023u;
    unsigned char *const gbase = smem_raw + (sK - raw);
    const uint32_t sV = sK + C::KTILE, sQ = sK + 2 * C::KTILE, sO = sQ + NS * C::QTILE;
    float *const lse_b = reinterpret_cast<float *>(gbase + 2 * C::KTILE + 2 * NS * C::QTILE);
    float *const D_b = lse_b + NS * BQ;
    int *const lo_b = reinterpret_cast<int *>(D_b + NS * BQ); /* DOC */
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(bars);
    const uint32_t kv_full = bar0;
    auto full = [&](int s) { return bar0 + 8u * (1 + s); };
    auto empty = [&](int s) { return bar0 + 8u * (1 + NS + s); };

    const int kvh = blockIdx.x, kt = blockIdx.y, z = blockIdx.z, b = b0 + z;
    const int k0 = kt * BK;
    const int group = nh / nkv;
    const size_t C3 = (size_t)(nh + 2 * nkv) * HD;
    /* query steps from the block's first key to T (DOC: to q_end), head-major; every warp
     * finds q_end itself */
    const int q_end = DOC ? doc_query_end(doc, b, T, k0 + BK - 1) : T;
    const int nqt = (q_end - k0 + BQ - 1) / BQ, nsteps = group * nqt;
    const int lane = threadIdx.x & 31, warp_all = threadIdx.x >> 5;

    if (threadIdx.x == 0) {
        mbar_init(kv_full, 1);
        for (int s = 0; s < NS; s++) {
            mbar_init(full(s), 32);
            mbar_init(empty(s), 8);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (warp_all >= 8) { /* the producer warpgroup: warp 8 loads, the others leave */
        setmaxnreg_dec<DKV_WS_PRODUCER_REGS>();
        if (warp_all != 8) return;
        if (lane == 0) {
            tma_prefetch_desc(&tm_kv);
            tma_prefetch_desc(&tm_q);
            tma_prefetch_desc(&tm_o);
            mbar_arrive_expect_tx(kv_full, 2 * C::KTILE);
#pragma unroll
            for (int p = 0; p < NP; p++) {
                tma_load_3d(sK + p * C::KPAN, &tm_kv, kv_full, (nh + kvh) * HD + 64 * p, k0, b);
                tma_load_3d(sV + p * C::KPAN, &tm_kv, kv_full, (nh + nkv + kvh) * HD + 64 * p, k0, b);
            }
        }
        int hi = 0, qs = 0; /* step s = hi·nqt + qs: head kvh·group + hi, queries k0 + 64·qs.. */
        for (int s = 0; s < nsteps; s++) {
            const int slot = s % NS, u = s / NS;
            const int h = kvh * group + hi, q0 = k0 + qs * BQ;
            /* this lane's lse and D (queries q0 + lane, q0 + lane + 32), loaded before the
             * wait for the slot so that their latency hides behind it; +inf makes every
             * probability of a query past T exactly zero */
            const size_t row = ((size_t)b * nh + h) * T;
            float lv[2], dv[2];
            int ov[2]; /* DOC: the queries' first keys (T past T: masks every key) */
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int q = q0 + lane + 32 * e;
                lv[e] = q < T ? lse[row + q] * LOG2E : INFINITY;
                dv[e] = q < T ? Dv[row + q] : 0.0f;
                if (DOC) ov[e] = q < T ? doc_first_key(doc, b, T, q) : T;
            }
            if (u > 0) mbar_wait(empty(slot), (u - 1) & 1); /* both warpgroups are done with step s - NS */
            if (lane == 0) {
                mbar_expect_tx(full(slot), 2 * C::QTILE);
#pragma unroll
                for (int p = 0; p < NP; p++) {
                    tma_load_3d(sQ + slot * C::QTILE + p * QPANEL, &tm_q, full(slot), h * HD + 64 * p, q0, b);
                    tma_load_3d(sO + slot * C::QTILE + p * QPANEL, &tm_o, full(slot), h * HD + 64 * p, q0, b);
                }
            }
#pragma unroll
            for (int e = 0; e < 2; e++) {
                lse_b[slot * BQ + lane + 32 * e] = lv[e];
                D_b[slot * BQ + lane + 32 * e] = dv[e];
                if (DOC) lo_b[slot * BQ + lane + 32 * e] = ov[e];
            }
            mbar_arrive(full(slot)); /* release: this lane's stores above */
            if (++qs == nqt) qs = 0, hi++;
        }
        return;
    }

    /* the consumers */
    setmaxnreg_inc<DKV_WS_CONSUMER_REGS>();
    const int wl = warp_all >> 2, warp = warp_all & 3;
    const int g = lane >> 2, t = lane & 3;
    const int kg0 = k0 + 64 * wl;        /* the warpgroup's first key */
    const int kr0 = kg0 + 16 * warp + g; /* the thread's keys: kr0, kr0 + 8 */

    /* the warpgroup's K and V rows as A (K-major); the query tiles' descriptors of slot 0 */
    const uint64_t dKa = make_desc(sK + 64 * wl * ROW_BYTES, 16, 1024);
    const uint64_t dVa = make_desc(sV + 64 * wl * ROW_BYTES, 16, 1024);
    const uint64_t dQk = make_desc(sQ, 16, 1024), dOk = make_desc(sO, 16, 1024);
    const uint64_t dQn = make_desc(sQ, QPANEL, 1024), dOn = make_desc(sO, QPANEL, 1024);

    float dv[NA], dk[NA], s[32], dp[32];
    uint32_t pa[16], sa[16];
#pragma unroll
    for (int i = 0; i < NA; i++) dv[i] = dk[i] = 0.0f;
    reg_fence(dv); /* the zeros are set before any product is issued (see below) */
    reg_fence(dk);

    /* this lane's place in fragment (4wl + warp)·4 + 0 of the block's dS tile for query
     * tile 0 of head 0 (per step: + the tile's number · DS_TILE) */
    bf16 *const ds_lane = dS + ((size_t)z * nh * ds_head + kt) * DS_TILE +
                          (size_t)((4 * wl + warp) * 4) * DS_FRAG + lane * 8;
    /* this warp is done with a slot (its warpgroup's products reading it were waited for,
     * every lane's lse / D reads are behind the __syncwarp); a predicated arrive, no branch */
    auto release = [&](int slot, bool pred) {
        __syncwarp();
        mbar_arrive_if(empty(slot), lane == 0 && pred);
    };
    /* Sᵀ (and dPᵀ) of step st, each its own commit group */
    auto issue_s = [&](int st) {
        wgmma_fence();
        gemm_kq<HD, C::KPAN>(s, dKa, desc_add(dQk, (st % NS) * C::QTILE));
        wgmma_commit();
    };
    auto issue_dp = [&](int st) {
        wgmma_fence();
        gemm_kq<HD, C::KPAN>(dp, dVa, desc_add(dOk, (st % NS) * C::QTILE));
        wgmma_commit();
    };
    auto slot_ready = [&](int st) { mbar_wait(full(st % NS), (st / NS) & 1); };

    /* A step is carried into the next (its slot released at the top of the next) only when
     * the next is this warpgroup's too; otherwise it ends waiting for everything, skips,
     * then issues the next step's Sᵀ: every wgmma issue in a branch is reached with
     * nothing in flight, which is what keeps ptxas from serialising them (C7518 with a
     * skip test inside the loop). */
    int step = 0, hi = 0, qs = 0; /* step = hi·nqt + qs: head kvh·group + hi, queries k0 + 64·qs.. */
    /* steps this warpgroup skips (all its keys after all the queries: warpgroup 1 on the
     * first step of a head): wait for the slot's phase, release it; only where no product
     * is in flight */
    auto skip_steps = [&]() {
        while (step < nsteps && kg0 > k0 + qs * BQ + BQ - 1) {
            slot_ready(step);
            release(step % NS, true);
            step++;
            if (++qs == nqt) qs = 0, hi++;
        }
    };
    bool carried = false; /* step - 1's dK in flight, its slot not yet released */
    mbar_wait(kv_full, 0);
    skip_steps();
    if (step == nsteps) goto done; /* warpgroup 1 of a block with nqt = 1 */
    slot_ready(step);
    issue_s(step);
    for (;;) {
        const int slot = step % NS;
        const int h = kvh * group + hi, q0 = k0 + qs * BQ;
        if (++qs == nqt) qs = 0, hi++;
        const uint32_t qoff = slot * C::QTILE;
        wgmma_wait<0>(); /* step - 1's dV, dK, Sᵀ */
        issue_dp(step);
        reg_fence(s);
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(sa);
        /* step - 1's slot, when its products were still in flight at the end of it (the
         * other path released it there, and skipped steps release their own) */
        release((step + NS - 1) % NS, carried);
        const float *const lse_s = lse_b + slot * BQ, *const D_s = D_b + slot * BQ;
        const int *const lo_s = lo_b + slot * BQ;

        /* Pᵀ into pf, dSᵀ straight into sa, never in place (see above); pf takes s's
         * registers */
        float pf[32];
        const bool diag = kg0 + 63 > q0; /* some key follows some query */
        const bool before = DOC && kg0 < lo_s[BQ - 1]; /* some key precedes some first key */
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int qi = 8 * (i >> 2) + 2 * t + (i & 1);
            float p = ex2(fmaf(s[i], scale_log2, -lse_s[qi]));
            if (diag && kr0 + 8 * ((i >> 1) & 1) > q0 + qi) p = 0.0f;
            if (before && kr0 + 8 * ((i >> 1) & 1) < lo_s[qi]) p = 0.0f;
            pf[i] = p;
        }
        wgmma_wait<0>(); /* dPᵀ */
        reg_fence(dp);

#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int qi = 8 * (i >> 1) + 2 * t; /* of element 2i; 2i + 1 is qi + 1 */
            pa[i] = pack_bf16(pf[2 * i], pf[2 * i + 1]);
            sa[i] = pack_bf16(pf[2 * i] * (dp[2 * i] - D_s[qi]) * scale,
                              pf[2 * i + 1] * (dp[2 * i + 1] - D_s[qi + 1]) * scale);
        }
        /* (a step of this warpgroup has keys at or before some query: stored always; the
         * test is kept, a predicated store) */
        if (kg0 <= q0 + BQ - 1) {
            bf16 *const ds_out = ds_lane + ((size_t)h * ds_head + ds_tile_base(q0 / BQ)) * DS_TILE;
#pragma unroll
            for (int kq = 0; kq < 4; kq++)
                *reinterpret_cast<uint4 *>(ds_out + kq * DS_FRAG) =
                    make_uint4(sa[4 * kq], sa[4 * kq + 1], sa[4 * kq + 2], sa[4 * kq + 3]);
        }

        wgmma_fence();
        gemm_acc<HD>(dv, pa, desc_add(dOn, qoff));
        wgmma_commit();
        wgmma_fence();
        gemm_acc<HD>(dk, sa, desc_add(dQn, qoff));
        wgmma_commit();
        if (step + 1 < nsteps && kg0 <= k0 + qs * BQ + BQ - 1) {
            slot_ready(step + 1);
            issue_s(step + 1);
            step++;
            carried = true;
            continue;
        }
        wgmma_wait<0>();
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(sa);
        release(slot, true);
        carried = false;
        step++;
        skip_steps();
        if (step == nsteps) break;
        slot_ready(step);
        issue_s(step);
    }
done:
    /* rope (non-NULL): dk w.r.t. the pre-RoPE k; the thread's rows are keys
     * k0 + 64·wl + 16·warp + (lane >> 2) (+ 8) */
    if (rope != nullptr) rope_inv_acc<HD>(dk, rope, k0 + 64 * wl + 16 * warp + (lane >> 2), T, lane & 3);
    dkv_store<HD, C::KPAN, C::KTILE>(gbase, dk, dv, dqkv, b, T, k0, C3, nh, nkv, kvh, wl, warp,
                                     lane);
#endif /* SHLM_WGMMA */
}
/* ------------------------------------------------------------------ dQ */

#if SHLM_WGMMA
/* Transposes an 8×8 bf16 matrix held in C-fragment form (lane (g, t): row g, columns 2t,
 * 2t+1): lane (g, t) receives row g, columns 2t, 2t+1 of the transpose. */
__device__ __forceinline__ uint32_t movm_trans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* dq += dS·K over the first NK key steps (16 keys each) of a staged key tile: the A
 * fragments from the staged dS tile (fr: this lane's 16 bytes of fragment 0·4 + warp),
 * K N-major (tnspB = 1) */
template <int HD, int NK>
__device__ __forceinline__ void dq_tile(float (&dq)[HD / 2], const unsigned char *fr, uint64_t dk) {
    uint32_t a[4 * NK];
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
        /* the quarters (keys 0-7 | 8-15) × (queries 0-7 | 8-15) of dSᵀ in registers 0-3
         * (an A fragment of dSᵀ); transposed, they are A registers 0, 2, 1, 3 of dS */
        const uint4 v = *reinterpret_cast<const uint4 *>(fr + kk * 4 * DS_FRAG * 2);
        a[4 * kk] = movm_trans(v.x);
        a[4 * kk + 1] = movm_trans(v.z);
        a[4 * kk + 2] = movm_trans(v.y);
        a[4 * kk + 3] = movm_trans(v.w);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
        const uint64_t d = desc_add(dk, kk * 16 * ROW_BYTES);
        if constexpr (HD == 128) wgmma_rs_n128_t(dq, &a[4 * kk], d);
        else wgmma_rs_n64_t(dq, &a[4 * kk], d);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq);
    reg_fence(a);
}

/* A warpgroup's dq (fp32 m64n{hd} accumulator, the C fragment) as bf16 into the rows
 * it owns: staged through shared memory at stg (row 0 = the warpgroup's first query;
 * 64 rows of 128 bytes per 64-column panel, panels PAN bytes apart, the 128-byte swizzle:
 * chunk c of row r at c ^ (r % 8); stg 1024-aligned), then 16-byte row stores to rows
 * (the dq row of the warpgroup's first query: row r at rows + r·C3), rows r < nvalid
 * only. Each warp writes and reads back only its own 16 rows; the caller makes sure
 * nothing else reads or writes those staging rows meanwhile. Shared by
 */
template <int HD, int PAN>
__device__ __forceinline__ void dq_store(unsigned char *stg, const float (&dq)[HD / 2],
                                         bf16 *rows, int nvalid, size_t C3, int warp, int lane) {
    constexpr int CH = HD / 8;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = 16 * warp + g + 8 * r; /* row % 8 == g */
            const uint32_t o = (j >> 3) * PAN + row * ROW_BYTES + (((j & 7) ^ g) << 4) + 4 * t;
            *reinterpret_cast<uint32_t *>(stg + o) = pack_bf16(dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
        }
    __syncwarp();
#pragma unroll
    for (int i = lane; i < 16 * CH; i += 32) {
        const int row = 16 * warp + i / CH, c = i % CH;
        const uint32_t o = (c >> 3) * PAN + row * ROW_BYTES + (((c & 7) ^ (row & 7)) << 4);
        if (row < nvalid)
            *reinterpret_cast<uint4 *>(rows + (size_t)row * C3 + c * 8) =
                *reinterpret_cast<const uint4 *>(stg + o);
    }
}
#endif

/* the dQ pass's shared memory: two stages of 128 K rows and the block's two dS tiles */
template <int HD> struct dqcfg {
    static constexpr int NS = 2; /* stages (copies one step ahead) */
    static constexpr int KTILE = (HD / 64) * KPANEL;
    static constexpr int STAGE = KTILE + 2 * DS_TILE * 2; /* K rows, 2 dS tiles */
    static constexpr int SMEM = NS * STAGE + 1024;
};

/* dQ = dS·K, the work of attention.cu's attn_bwd_dq_kernel on wgmma. Block (head,
 * 128-query tile qt, batch element b0 + z), longest first, two warpgroups of 128 threads;
 * warpgroup wg owns the 64-query dS tile Q = 2qt + wg. Over key tiles 0..qt in order
 * (deterministic), each stage copies (cp.async, double-buffered) the 128 K rows into a
 * swizzled tile and the two dS tiles (Q, kt) as they are (16 KiB each); warp w loads its
 * fragments kk·4 + w (its 16 queries × keys 16kk..), transposes their quarters with
 * movmatrix into register-A fragments of dS and the warpgroup runs dq += dS·K (rs
 * m64n{hd}k16, K N-major as V in the forward). On the diagonal tile of an even Q only
 * keys 0-63 count: the dK/dV pass did not write the rest (its keys all follow the
 * queries). DOC: key tiles from the first key tile of query tile 2qt, each warpgroup
 * skipping those before its own tile's (attention_doc.cuh): exactly the dS tiles the dK/dV
 * pass wrote. dQ leaves through an unused stage. The pass is bound by memory, not by wgmma
 * (an estimate: it moves about 2·nh·T² bytes, the dS tiles once from HBM and as many K
 * bytes mostly from L2; the dS half alone takes ~115 us at 4.8 TB/s at T = 4096 and 32
 * heads, of the ~240 us the pass takes). */
template <int HD, bool DOC>
__global__ void __launch_bounds__(2 * WG_THREADS, 1)
    attn_bwd_dq_wgmma(bf16 *dqkv, const bf16 *dS, size_t ds_head, const bf16 *qkv, int b0, int T,
                      int nh, int nkv, const float2 *rope, const int32_t *doc) {
#if SHLM_WGMMA
    using C = dqcfg<HD>;
    constexpr int NS = C::NS;
    constexpr int NT = 2 * WG_THREADS;
    constexpr int NA = HD / 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t s0 = (raw + 1023u) & ~1023u;
    unsigned char *const g0 = smem_raw + (s0 - raw);

    /* qt: the block's 128-query tile, longest first; Qb: its first 64-query dS tile */
    const int h = blockIdx.x, qt = gridDim.y - 1 - blockIdx.y, z = blockIdx.z, b = b0 + z;
    const int Qb = 2 * qt;
    const int kvh = h / (nh / nkv);
    const int q0 = Qb * BQ;
    const size_t C3 = (size_t)(nh + 2 * nkv) * HD;
    const bf16 *const kbase = qkv + (size_t)b * T * C3 + (size_t)(nh + kvh) * HD;
    const bf16 *const dsh = dS + ((size_t)z * nh + h) * ds_head * DS_TILE;
    const int nq64 = (T + BQ - 1) / BQ;
    /* key tiles kb..qt, step s at key tile kb + s: 128·qt <= q0 < T; kb = 0 or (DOC) the
     * first key tile of query tile Qb (attention_doc.cuh) */
    const int kb = DOC ? doc_first_key(doc, b, T, q0) / BK : 0;
    const int nsteps = qt + 1 - kb;
    auto issue = [&](int s) {
        const uint32_t st = s0 + (s % NS) * C::STAGE;
        load_tile<HD, BK, NT>(st, kbase, C3, (kb + s) * BK, T);
#pragma unroll
        for (int qh = 0; qh < 2; qh++) {
            const int Q = Qb + qh;
            if (Q >= nq64) break;
            const bf16 *const src = dsh + (ds_tile_base(Q) + kb + s) * DS_TILE;
            const uint32_t dst = st + C::KTILE + qh * DS_TILE * 2;
            /* the diagonal tile of an even Q: only fragments 0-15 (keys 0-63) were written
             * by the dK/dV pass, and only they are read (dq_tile<HD, 4>) */
            const int n16 = (kb + s == qt && (Q & 1) == 0) ? DS_TILE / 16 : DS_TILE / 8;
#pragma unroll 4
            for (int i = threadIdx.x; i < n16; i += NT)
                cp_async16(dst + 16 * i, src + 8 * i, true);
        }
    };
    issue(0);
    cp_async_commit();

    const int wl = threadIdx.x >> 7; /* the warpgroup in the block */
    const int Q = Qb + wl;           /* its dS tile of 64 queries */
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const bool active = Q < nq64; /* the warpgroup has queries */
    /* DOC: the warpgroup's own first key tile (the dK/dV pass wrote no dS tile of Q before
     * it) */
    const int kw = DOC && active ? doc_first_key(doc, b, T, Q * BQ) / BK : 0;
    float dq[NA];
#pragma unroll
    for (int i = 0; i < NA; i++) dq[i] = 0.0f;

    for (int s = 0; s < nsteps; s++) {
        /* stage s; everyone is done with stage s-1's buffer, which the copies for stage
         * s + 1 now refill (each step commits one group, perhaps empty) */
        tiles_ready<NS - 2>();
        if (s + NS - 1 < nsteps) issue(s + NS - 1);
        cp_async_commit();
        if (!active || (DOC && kb + s < kw)) continue;
        const int off = (s % NS) * C::STAGE;
        const unsigned char *const fr =
            g0 + off + C::KTILE + wl * DS_TILE * 2 + warp * DS_FRAG * 2 + lane * 16;
        const uint64_t dk = make_desc(s0 + off, KPANEL, 1024);
        if (kb + s == qt && (Q & 1) == 0) dq_tile<HD, 4>(dq, fr, dk);
        else dq_tile<HD, 8>(dq, fr, dk);
    }
    if (!active) return;
    /* rope (non-NULL): dq w.r.t. the pre-RoPE q; the thread's rows are queries
     * q0 + 64·wl + 16·warp + g (+ 8), the rows it stores below */
    if (rope != nullptr) rope_inv_acc<HD>(dq, rope, q0 + 64 * wl + 16 * warp + g, T, t);

    /* dq into the warpgroup's rows of an unused stage's K tile (the last step's neighbour:
     * every copy has landed, nothing reads it any more), then 16-byte row stores */
    dq_store<HD, KPANEL>(g0 + (nsteps % NS) * C::STAGE + 64 * wl * ROW_BYTES, dq,
                         dqkv + ((size_t)b * T + q0 + 64 * wl) * C3 + (size_t)h * HD,
                         T - q0 - 64 * wl, C3, warp, lane);
#endif /* SHLM_WGMMA */
}

/* ------------------------------------------------------------------ host side */

/* attn_bwd_dkv_ws: three tensor maps (K/V boxes of 128 rows and Q boxes of 64 over qkv,
 * dO boxes of 64 over dout), each covering batch elements 0..b0+nb-1; false (nothing
 * queued) when the driver cannot encode them */
template <int HD, bool DOC>
bool launch_dkv(bf16 *dqkv, bf16 *dS, size_t ds_head, const bf16 *dout, const bf16 *qkv,
                const float *lse, const float *Dv, const int32_t *doc, int b0, int nb, int T,
                int nh, int nkv, float scale, float scale_log2, const float2 *rope) {
    using C = cfg<HD, DOC>;
    static_assert(C::SMEM + 1024 <= 227 * 1024, "dynamic + static shared memory per block");
    const size_t C3 = (size_t)(nh + 2 * nkv) * HD, CO = (size_t)nh * HD;
    CUtensorMap tm_kv, tm_q, tm_o;
    if (!shlm_tma_host::make_map_bf16_3d(&tm_kv, qkv, C3, T, b0 + nb, BK) ||
        !shlm_tma_host::make_map_bf16_3d(&tm_q, qkv, C3, T, b0 + nb, BQ) ||
        !shlm_tma_host::make_map_bf16_3d(&tm_o, dout, CO, T, b0 + nb, BQ))
        return false;
    static bool done = false;
    if (!done) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkv_ws<HD, DOC>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
        done = true;
    }
    dim3 grid(nkv, (T + BK - 1) / BK, nb);
    attn_bwd_dkv_ws<HD, DOC><<<grid, DKV_WS_THREADS, C::SMEM, shlm_cuda_stream()>>>(
        dqkv, dS, ds_head, lse, Dv, tm_kv, tm_q, tm_o, b0, T, nh, nkv, scale, scale_log2, rope,
        doc);
    CUDA_CHECK_LAST();
    return true;
}

int dkv(void *dqkv, void *dS, size_t ds_head, const void *dout, const void *qkv, const float *lse,
        const float *Dv, const int32_t *doc, int b0, int nb, int T, int nh, int nkv, int hd,
        float scale, float scale_log2, const void *rope) {
    if (b0 < 0 || nb <= 0 || T <= 0 || nh <= 0 || nkv <= 0 || nh % nkv != 0) return 1;
    if (hd != 64 && hd != 128) return 1;
    if ((T + 63) / 64 > 65535 || nb > 65535 || nkv > 65535) return 1; /* grid limits */
    if (!shlm_aligned(qkv, 16) || !shlm_aligned(dout, 16) || !shlm_aligned(dqkv, 16) ||
        !shlm_aligned(dS, 16) || !shlm_aligned(lse, 4) || !shlm_aligned(Dv, 4) ||
        !shlm_aligned(rope, 16))
        return 1;
    if (!shlm_cuda_sm90_usable()) return 1; /* attention_sm90.cu's probe */
    bf16 *d = (bf16 *)dqkv, *s = (bf16 *)dS;
    const bf16 *g = (const bf16 *)dout, *x = (const bf16 *)qkv;
    const float2 *rp = (const float2 *)rope;
    auto run = [&](auto launch) {
        return launch(d, s, ds_head, g, x, lse, Dv, doc, b0, nb, T, nh, nkv, scale, scale_log2, rp);
    };
    bool ok;
    if (hd == 128) ok = doc ? run(launch_dkv<128, true>) : run(launch_dkv<128, false>);
    else ok = doc ? run(launch_dkv<64, true>) : run(launch_dkv<64, false>);
    return ok ? 0 : 1;
}

template <int HD, bool DOC>
void launch_dq(bf16 *dqkv, const bf16 *dS, size_t ds_head, const bf16 *qkv, const int32_t *doc,
               int b0, int nb, int T, int nh, int nkv, const float2 *rope) {
    using C = dqcfg<HD>;
    static bool done = false;
    if (!done) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_wgmma<HD, DOC>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
        done = true;
    }
    dim3 grid(nh, (T + 127) / 128, nb);
    attn_bwd_dq_wgmma<HD, DOC><<<grid, 2 * WG_THREADS, C::SMEM, shlm_cuda_stream()>>>(
        dqkv, dS, ds_head, qkv, b0, T, nh, nkv, rope, doc);
    CUDA_CHECK_LAST();
}

int dq(void *dqkv, const void *dS, size_t ds_head, const void *qkv, const int32_t *doc, int b0,
       int nb, int T, int nh, int nkv, int hd, const void *rope) {
    if (b0 < 0 || nb <= 0 || T <= 0 || nh <= 0 || nkv <= 0 || nh % nkv != 0) return 1;
    if (hd != 64 && hd != 128) return 1;
    if ((T + 63) / 64 > 65535 || nb > 65535 || nh > 65535) return 1;
    if (!shlm_aligned(qkv, 16) || !shlm_aligned(dqkv, 16) || !shlm_aligned(dS, 16) ||
        !shlm_aligned(rope, 16))
        return 1;
    if (!shlm_cuda_sm90_usable()) return 1; /* attention_sm90.cu's probe */
    bf16 *d = (bf16 *)dqkv;
    const bf16 *s = (const bf16 *)dS, *x = (const bf16 *)qkv;
    const float2 *rp = (const float2 *)rope;
    if (hd == 128) {
        if (doc) launch_dq<128, true>(d, s, ds_head, x, doc, b0, nb, T, nh, nkv, rp);
        else launch_dq<128, false>(d, s, ds_head, x, doc, b0, nb, T, nh, nkv, rp);
    } else {
        if (doc) launch_dq<64, true>(d, s, ds_head, x, doc, b0, nb, T, nh, nkv, rp);
        else launch_dq<64, false>(d, s, ds_head, x, doc, b0, nb, T, nh, nkv, rp);
    }
    return 0;
}

} // namespace sm90b
} // namespace

/* 0: queued (dk, dv rows of batch elements b0..b0+nb-1 and their dS tiles); 1: not
 * handled (shape, alignment, device, build or tensor maps), nothing queued. */
extern "C" int shlm_cuda_attention_bwd_dkv_sm90(void *dqkv, void *dS, size_t ds_head,
                                                const void *dout, const void *qkv,
                                                const float *lse, const float *D,
                                                const int32_t *doc_start, int b0, int nb, int T,
                                                int nh, int nkv, int hd, float scale,
                                                float scale_log2, const void *rope) {
    return sm90b::dkv(dqkv, dS, ds_head, dout, qkv, lse, D, doc_start, b0, nb, T, nh, nkv, hd,
                      scale, scale_log2, rope);
}

/* 0: queued (the dq rows of batch elements b0..b0+nb-1, from the dS tiles of the pass);
 * 1: not handled, nothing queued. */
extern "C" int shlm_cuda_attention_bwd_dq_sm90(void *dqkv, const void *dS, size_t ds_head,
                                               const void *qkv, const int32_t *doc_start, int b0,
                                               int nb, int T, int nh, int nkv, int hd,
                                               const void *rope) {
    return sm90b::dq(dqkv, dS, ds_head, qkv, doc_start, b0, nb, T, nh, nkv, hd, rope);
}
