/* cuda backend: causal grouped-query flash attention forward for Hopper (sm_90a) on
 * warpgroup MMA (wgmma.mma_async, bf16 operands, fp32 accumulation), fed by TMA.
 *
 * Contract: shlm_cuda_attention_fwd's (attention.cu, ops.h) for head_dim 64 and 128,
 * 16-byte-aligned qkv and out, on a compute capability 9.0 device; the entry point returns
 * 1 (nothing queued) for anything else, and attention.cu then runs its portable mma.sync
 * kernel, the declared fallback. Deterministic: every output row is computed by one
 * warpgroup, summing its key tiles in a fixed order.
 *
 * Shapes (ops.h): qkv (B·T, (nh + 2·nkv)·hd) rows hold [q heads | k heads | v heads]; out
 * (B·T, nh·hd); lse (B, nh, T) fp32, natural log; query head h reads kv head h / (nh/nkv).
 *
 * Tiles. A tile is (query tile of BM = 128 rows, head, batch element). One CTA = 384
 * threads: consumer warpgroups 0 and 1 (warps 0-7; warpgroup w owns rows 64w..64w+63, one
 * m64 wgmma tile) and producer warpgroup 2, where lane 0 of warp 8 issues every load.
 * Keys stream in tiles of BN = 128: S = Q·Kᵀ is one m64n128 product per warpgroup (hd/16
 * k-steps of 16), O += P·V one m64n{hd} product (8 k-steps over the tile's 128 keys).
 * Query tile qt visits key tiles 0..qt; only tile qt (the diagonal: BM == BN) is masked.
 * Documents (DOC, doc_start non-NULL; attention_doc.cuh): the tile visits key tiles
 * jb..qt, jb = its first row's first key / BN, and the tiles that start before its last
 * row's first key also mask keys before each row's first key (-inf); DOC = false is the
 * plain causal kernel, unchanged.
 *
 * Schedules. Few tiles (at most one per SM): one block per tile, longest rows first.
 * More: persistent blocks, one per SM, the producer taking the next tile of the list
 * (longest rows first) from a global counter (dynamic, so that SMs held by another
 * stream's kernel, as NCCL's are in training, delay nobody: a static split of the tiles
 * measured 347 us against 259 us with 16 SMs held, B=1 T=4096 nh=32 hd=128). In a single
 * wave the persistent form gains nothing (18.7 vs 19.0 us at B=2 T=1000 nh=8).
 * Measured on an H200 (B=1, T=4096, 32 heads, causal): hd 128 228 us (603 TFLOP/s at 4·hd
 * flops per causal pair), hd 64 170 us, against 463 and 268 us for the mma.sync kernel;
 * with 512-token documents 58 and 43 us.
 *
 * Copies. The producer loads Q, K, V by TMA (cp.async.bulk.tensor.3d from a CUtensorMap
 * over qkv seen as (column, row t, batch b), encoded on the host at each launch; boxes of
 * 64 columns × 128 rows with SWIZZLE_128B, exactly the panel layout below; rows >= T
 * arrive as zeros). K and V go through a ring of WS_STAGES buffers each, with mbarriers:
 * full (count 1: the producer's arrive.expect_tx of one tile's bytes, completed by the
 * TMA) and empty (count 8: lane 0 of each consumer warp arrives once its warpgroup's
 * products reading the buffer were waited for). No __syncthreads after the start.
 * Persistent blocks also have full / empty mbarriers for Q (the consumers release Q after
 * their last S of a tile, so the next tile's Q loads during the last P·V and the
 * epilogue), stage O in a tile of its own, and run the K/V ring and its phases on across
 * tiles. Registers: the launch gives 168 per thread (65536 / 384); setmaxnreg moves the
 * producer warpgroup to 24 and the consumers to 240 (a lone producer warp would not do:
 * warps are spread over the SM's four register files by warp index, so 9 warps cost as
 * much as 12).
 *
 * Shared memory (1024-byte aligned by hand): Q, (persistent: O,) K[2], V[2], each a tile
 * of 128 rows stored as hd/64 "panels" of 128 rows × 64 columns; a panel row is 128 bytes
 * (8 chunks of 16 bytes) and chunk c of row r sits at chunk position c ^ (r % 8): the
 * 128-byte swizzle (CUTLASS Swizzle<3,4,3>, TMA's SWIZZLE_128B). A panel is 16 KiB and
 * 1024-aligned, so every 8-row group is one swizzle atom, as the hardware wants for matrix
 * base offset 0. The same byte layout serves all three operands:
 *   Q (A of S = Q·Kᵀ): K-major (head dim contiguous), tnspA = 0;
 *   K (B of S):         K-major, tnspB = 0 (B(k = dim, n = key) = K[key][dim]);
 *   V (B of O += P·V):  B(k = key, n = dim) = V[key][dim] is N-major (dim contiguous), so
 *                       tnspB = 1 (allowed for bf16 only), no transposed copy of V.
 * Matrix descriptors (wgmma.cuh's make_desc; PTX ISA "Matrix Descriptor Format"):
 *   Q, K (K-major): SBO = 1024 (one 8-row group to the next), LBO unused for swizzled
 *       K-major layouts, encoded as 16 like CUTLASS; k-step kk of 16 columns: start +
 *       (kk / 4)·16384 (the panel) + (kk % 4)·32 bytes (the hardware applies the XOR to
 *       the computed address, as CUTLASS's descriptor iterator and DeepGEMM rely on).
 *   V (N-major): LBO = 16384 (one 64-column panel to the next: n128 spans both panels),
 *       SBO = 1024 (keys 0-7 to keys 8-15 of the k-step); k-step kk: start + kk·2048
 *       bytes (16 key rows): the canonical MN-major layout of the PTX ISA and CUTLASS's
 *       make_gmma_desc<Major::MN>.
 *
 * Fragments (PTX ISA "Matrix Fragments for wgmma.mma_async.m64nNk16"): thread i of the
 * warpgroup, warp w = i / 32 (of the warpgroup), lane (g = lane / 4, t = lane % 4), owns
 * rows 16w + g and 16w + g + 8 of the m64 tile; accumulator register 4j + 2r + e holds
 * row 16w + g + 8r, column 8j + 2t + e: per 8-column block exactly mma.sync's C fragment.
 * The register A fragment (4 × b32) is mma.m16n8k16's A fragment per warp, so for P·V's
 * k-step kk register q is bf16x2(s[8kk + 2q], s[8kk + 2q + 1]): P[i] = pack(s[2i],
 * s[2i+1]) over the whole row (FA2's trick, as in attention.cu), and P never leaves
 * registers.
 *
 * Pipeline per consumer warpgroup (FlashAttention-3's intra-warpgroup overlap):
 *   S_0 = Q·K_0ᵀ; softmax -> P_0
 *   for j = 1..n-1:  issue S_j = Q·K_jᵀ; issue O += P_{j-1}·V_{j-1}
 *                    wait S_j (wait_group 1); softmax(S_j) in fp32 while P·V runs
 *                    wait P·V (wait_group 0); O *= alpha_j; P_j = bf16(S_j)
 *   O += P_{n-1}·V_{n-1}
 * wgmma.fence before a wgmma that reads registers written by ordinary instructions;
 * commit after each product's k-steps; empty asm statements with "+f"/"+r" operands after
 * every wait pin the compiler's uses of those registers after it (cute's
 * warpgroup_fence_operand). Both waits for a step's tiles come before its two products:
 * a loop between them would make ptxas insert a warpgroup.arrive before the second.
 * Scores are kept in the log2 domain (scale·log2 e folded into one FFMA, exp =
 * ex2.approx), lse = (m + log2 l)·ln 2, as in attention.cu. Ping-pong between the
 * warpgroups (FA3's inter-warpgroup schedule) and a third K/V stage measured within
 * run-to-run noise (±3%) of this at T = 4096, so neither is built. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/attention_doc.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/cuda/tma.cuh"

#include <math.h>

#include <algorithm>

namespace {
namespace sm90 {

constexpr int BM = 128;                 /* queries per tile, 64 per consumer warpgroup */
constexpr int BN = 128;                 /* keys per tile */
constexpr int ROW_BYTES = 128;          /* one swizzled panel row: 64 bf16 */
constexpr int PANEL = BM * ROW_BYTES;   /* 128 rows × 64 columns: 16 KiB */
constexpr float LOG2E = 1.4426950408889634f;
static_assert(BM == BN, "the diagonal tile is the last one and the only masked one");

template <int HD> struct cfg {
    static_assert(HD == 64 || HD == 128, "head_dim 64 or 128");
    static constexpr int TILE = (HD / 64) * PANEL; /* bytes of one 128-row tile */
};

/* Probe: set to 1 by a kernel compiled for sm_90a; the host asks once before launching. */
__device__ int g_probe;
__global__ void probe_kernel() { g_probe = SHLM_WGMMA; }

#if SHLM_WGMMA
using namespace shlm_wgmma;

/* ------------------------------------------------------------------ the steps */

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
 * first key) are -inf first; with LOW those before low[r] (the row's first key, as an
 * offset from the tile's first key: documents). */
template <bool MASK, bool LOW = false>
__device__ __forceinline__ void softmax_tile(float (&s)[64], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], const int (&lim)[2], int t,
                                             float scale_log2, const int (&low)[2] = {0, 0}) {
    if (MASK) {
#pragma unroll
        for (int i = 0; i < 64; i++)
            if (8 * (i >> 2) + 2 * t + (i & 1) > lim[(i >> 1) & 1]) s[i] = -INFINITY;
    }
    if (LOW) {
#pragma unroll
        for (int i = 0; i < 64; i++)
            if (8 * (i >> 2) + 2 * t + (i & 1) < low[(i >> 1) & 1]) s[i] = -INFINITY;
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
        /* -inf while every key the row has seen was masked (documents: tiles before its
         * first key); it sees its own key on the diagonal */
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
/* The epilogue, part 1: the row sums over the quad, each of the thread's two rows' lse
 * (natural log) written once, and 1/l returned for part 2. */
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

constexpr int WS_THREADS = 384;
constexpr int WS_STAGES = 2; /* K/V ring slots */
constexpr int WS_PRODUCER_REGS = 24, WS_CONSUMER_REGS = 240; /* 128·24 + 256·240 <= 65536 */

#if SHLM_WGMMA
using namespace shlm_tma;
#endif

/* Persistent blocks take their tiles from g_tile_next (atomicAdd by the producer, which
 * passes each index to the consumers through a 2-slot ring in shared memory: tile_full /
 * tile_empty mbarriers); a block that gets an index past the end stops, and the last block
 * to stop sets both counters back to 0 for the next launch (so no memset and no host
 * state: CUDA-graph safe; two such launches must not overlap, which the backend's single
 * stream guarantees). */
__device__ unsigned int g_tile_next, g_tile_done;

template <int HD, bool PERSIST, bool DOC>
__global__ void __launch_bounds__(WS_THREADS, 1)
    attn_fwd_ws(bf16 *out, float *lse, const __grid_constant__ CUtensorMap tm, int T, int nh,
                int nkv, int nqt, int B, float scale_log2, const int32_t *doc) {
#if SHLM_WGMMA
    constexpr int STAGES = WS_STAGES;
    using C = cfg<HD>;
    constexpr int NO = HD / 2; /* O accumulators per thread: 64 × HD over 128 threads */
    constexpr int NP = HD / 64; /* panels per tile: TMA boxes per tile */
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t bars[6 + 4 * STAGES];
    __shared__ int tile_slot[2];
    /* swizzle atoms must start on 1024-byte boundaries: align by hand (the launch adds 1
     * KiB of slack), keeping a generic pointer to the same byte for the epilogue */
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
    /* the block's k-th tile (head h, query tile qt, batch b); false past its last.
     * PERSIST: tile w of the list (w the k-th index taken from g_tile_next), longest rows
     * first; else the block's one tile, from the block index (query tiles in reverse). */
    auto tile = [&](int k, int w, int &h, int &qt, int &b) -> bool {
        if constexpr (PERSIST) {
            if (w >= total) return false;
            const int r = w % (nh * B);
            qt = nqt - 1 - w / (nh * B), h = r % nh, b = r / nh;
            return true;
        } else {
            h = blockIdx.x, qt = gridDim.y - 1 - blockIdx.y, b = blockIdx.z;
            return k == 0;
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
            /* the k-th tile: PERSIST takes it from the counter and publishes it */
            auto next = [&](int k) -> bool {
                int w = 0;
                if constexpr (PERSIST) {
                    if (k >= 2) mbar_wait(tile_empty(k & 1), ((k >> 1) - 1) & 1);
                    w = (int)atomicAdd(&g_tile_next, 1u);
                    *(volatile int *)&tile_slot[k & 1] = w;
                    mbar_arrive(tile_full(k & 1)); /* release: the slot is written */
                }
                return tile(k, w, h, qt, b);
            };
            for (int k = 0; next(k); k++) {
                const int kvh = h / (nh / nkv);
                const int cq = h * HD, ck = (nh + kvh) * HD, cv = (nh + nkv + kvh) * HD;
                if (k > 0) mbar_wait(emptyQ, (k - 1) & 1);
                mbar_arrive_expect_tx(fullQ, C::TILE);
#pragma unroll
                for (int p = 0; p < NP; p++)
                    tma_load_3d(sQ + p * PANEL, &tm, fullQ, cq + 64 * p, qt * BM, b);
                /* DOC: from the first key tile the tile's first row sees */
                const int jb = DOC ? doc_first_key(doc, b, T, qt * BM) / BN : 0;
                for (int j = jb; j <= qt; j++, it++) {
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
            if constexpr (PERSIST) {
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
    const int wrow = 64 * wg + 16 * warp + g; /* the thread's rows: wrow, wrow + 8 */
    /* descriptors of this warpgroup's Q rows and of ring slot 0 of K and V */
    const uint64_t dq = make_desc(sQ + 64 * wg * ROW_BYTES, 16, 1024);
    const uint64_t dk0 = make_desc(sK, 16, 1024);
    const uint64_t dv0 = make_desc(sV, PANEL, 1024);
    /* ring slots and phases by the running K/V tile count i */
    auto dk = [&](int i) { return desc_add(dk0, (i % STAGES) * C::TILE); };
    auto dv = [&](int i) { return desc_add(dv0, (i % STAGES) * C::TILE); };
    auto par = [&](int i) { return (uint32_t)((i / STAGES) & 1); };
    /* this warp is done with a buffer (its warpgroup's products reading it were waited for) */
    auto release = [&](uint32_t bar) { mbar_arrive_if(bar, lane == 0); };
    const int lim[2] = {wrow, wrow + 8}; /* row offsets from the diagonal tile's first key */

    int i0 = 0; /* K/V tiles consumed before this query tile */
    int h, qt, b;
    auto next = [&](int k) -> bool {
        int w = 0;
        if constexpr (PERSIST) {
            mbar_wait(tile_full(k & 1), (k >> 1) & 1);
            w = *(volatile int *)&tile_slot[k & 1];
            __syncwarp();
            release(tile_empty(k & 1));
        }
        return tile(k, w, h, qt, b);
    };
    for (int k = 0; next(k); k++) {
        const int q0 = qt * BM;
        /* DOC: key tiles jb..qt (as the producer), each row's first key (rows past T take
         * the last row's), the last row's */
        const int jb = DOC ? doc_first_key(doc, b, T, q0) / BN : 0, n = qt + 1 - jb;
        int low[2] = {0, 0}, low_last = 0;
        if constexpr (DOC) {
            low[0] = doc_first_key(doc, b, T, min(q0 + wrow, T - 1));
            low[1] = doc_first_key(doc, b, T, min(q0 + wrow + 8, T - 1));
            low_last = doc_first_key(doc, b, T, min(q0 + BM - 1, T - 1));
        }
        float o[NO], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
        uint32_t p[32];
#pragma unroll
        for (int i = 0; i < NO; i++) o[i] = 0.0f;
        /* the softmax of relative key tile j (diag: the last, the diagonal); DOC: the rows'
         * first keys count on the tiles that start before the last row's */
        auto softmax = [&](bool diag, int j) {
            if constexpr (DOC) {
                const int k0 = (jb + j) * BN;
                const int rel[2] = {low[0] - k0, low[1] - k0};
                if (k0 < low_last) {
                    if (diag) softmax_tile<true, true>(s, m, l, alpha, lim, t, scale_log2, rel);
                    else softmax_tile<false, true>(s, m, l, alpha, lim, t, scale_log2, rel);
                    return;
                }
            }
            if (diag) softmax_tile<true>(s, m, l, alpha, lim, t, scale_log2);
            else softmax_tile<false>(s, m, l, alpha, lim, t, scale_log2);
        };

        mbar_wait(fullQ, k & 1);
        mbar_wait(fullK(i0 % STAGES), par(i0));
        wgmma_fence();
        gemm_qk<HD>(s, dq, dk(i0));
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);
        release(emptyK(i0 % STAGES));
        if constexpr (PERSIST) mbar_arrive_if(emptyQ, lane == 0 && n == 1);
        softmax(n == 1, 0);
        to_bf16(p, s);
        for (int j = 1; j < n; j++) {
            const int i = i0 + j;
            /* both waits first: a loop between the two products would make ptxas insert a
             * warpgroup.arrive before the second (V_{j-1} was loaded before K_j anyway) */
            mbar_wait(fullK(i % STAGES), par(i));
            mbar_wait(fullV((i - 1) % STAGES), par(i - 1));
            wgmma_fence();
            gemm_qk<HD>(s, dq, dk(i));
            wgmma_commit();
            gemm_pv<HD>(o, p, dv(i - 1));
            wgmma_commit();
            wgmma_wait<1>(); /* S_j */
            reg_fence(s);
            release(emptyK(i % STAGES));
            if constexpr (PERSIST) mbar_arrive_if(emptyQ, lane == 0 && j == n - 1);
            softmax(j == n - 1, j);
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

/* Queues attn_fwd_ws; false (nothing queued) when the driver cannot encode the tensor map
 * or the tile count does not fit an int. */
template <int HD, bool PERSIST, bool DOC>
bool launch(bf16 *out, float *lse, const bf16 *qkv, const int32_t *doc, int B, int T, int nh,
            int nkv) {
    constexpr int SMEM = (1 + (PERSIST ? 1 : 0) + 2 * WS_STAGES) * cfg<HD>::TILE + 1024;
    /* qkv as (column, row t < T, batch b < B), boxes of 64 columns x BN rows: one panel
     * of the kernel's layout per load */
    CUtensorMap map;
    if (!shlm_tma_host::make_map_bf16_3d(&map, qkv, (size_t)(nh + 2 * nkv) * HD, T, B, BN))
        return false;
    static bool done = false;
    if (!done) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_ws<HD, PERSIST, DOC>,
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
    attn_fwd_ws<HD, PERSIST, DOC><<<grid, WS_THREADS, SMEM, shlm_cuda_stream()>>>(
        out, lse, map, T, nh, nkv, nqt, B, scale_log2, doc);
    CUDA_CHECK_LAST();
    return true;
}

template <int HD, bool DOC>
bool launch_hd(bool persist, bf16 *o, float *lse, const bf16 *x, const int32_t *doc, int B, int T,
               int nh, int nkv) {
    return persist ? launch<HD, true, DOC>(o, lse, x, doc, B, T, nh, nkv)
                   : launch<HD, false, DOC>(o, lse, x, doc, B, T, nh, nkv);
}

int forward(void *out, float *lse, const void *qkv, const int32_t *doc, int B, int T, int nh,
            int nkv, int hd) {
    if (B <= 0 || T <= 0 || nh <= 0 || nkv <= 0 || nh % nkv != 0) return 1;
    if (hd != 64 && hd != 128) return 1;
    if ((T + BM - 1) / BM > 65535 || B > 65535 || nh > 65535) return 1; /* grid limits */
    if (!shlm_aligned(qkv, 16) || !shlm_aligned(out, 16) || !shlm_aligned(lse, 4)) return 1;
    if (!usable()) return 1;
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)qkv;
    /* persistent when the tiles fill more than one wave of blocks */
    const bool persist = (long)nh * ((T + BM - 1) / BM) * B > shlm_cuda_sm_count();
    bool ok;
    if (hd == 128)
        ok = doc ? launch_hd<128, true>(persist, o, lse, x, doc, B, T, nh, nkv)
                 : launch_hd<128, false>(persist, o, lse, x, doc, B, T, nh, nkv);
    else
        ok = doc ? launch_hd<64, true>(persist, o, lse, x, doc, B, T, nh, nkv)
                 : launch_hd<64, false>(persist, o, lse, x, doc, B, T, nh, nkv);
    return ok ? 0 : 1;
}

} // namespace sm90
} // namespace

/* 0: done (out and lse written, queued on the backend's stream); 1: not handled (shape,
 * alignment, device, build or tensor map), nothing queued: the caller runs attention.cu's
 * kernel. */
extern "C" int shlm_cuda_attention_fwd_sm90(void *out, float *lse, const void *qkv,
                                            const int32_t *doc_start, int B, int T, int nh,
                                            int nkv, int hd) {
    return sm90::forward(out, lse, qkv, doc_start, B, T, nh, nkv, hd);
}

/* 1 when this process's device can run the sm_90a kernels (this file's and
 * attention_bwd_sm90.cu's): compute capability 9.0 and the sm_90a image in the binary. */
extern "C" int shlm_cuda_sm90_usable(void) { return sm90::usable() ? 1 : 0; }
