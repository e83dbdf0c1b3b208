/* cuda backend: the causal grouped-query flash attention backward's two heavy passes for
 * Hopper (sm_90a) on warpgroup MMA (wgmma.mma_async, bf16 operands, fp32 accumulation):
 *  - dK/dV (and dS): same contract as attn_bwd_dkv_kernel in attention.cu (read the
 *    comments above it and above bwd_scratch_layout): same inputs, writes the dk and dv
 *    rows of dqkv and the dS scratch in exactly the same fragment layout, so either dQ
 *    kernel can follow it;
 *  - dQ = dS·K: same contract as attn_bwd_dq_kernel, reading that scratch.
 * head_dim 64 and 128 only; the caller (attention.cu's bwd_launch) falls back to the
 * mma.sync kernel of a pass whenever the entry point returns 1.
 *
 * STATUS: checked on an H200 by tests/gpu/attn_bwd_sm90_check.cu (whole backward: D, then
 * the dK/dV and dQ passes in every combination of kernels and variants): dq, dk, dv
 * bitwise equal to the backward on attention.cu's mma.sync kernels in every case (T 130,
 * 256, 1000, 4096; GQA 2:1, 4:1 and none; hd 64 and 128; two batch elements, and two
 * passes at T = 4096, B = 2), worst relative L2 error against a float64 reference 3.1e-3
 * (the mma.sync backward's is the same), bitwise repeatable, nothing left unwritten,
 * compute-sanitizer memcheck clean (--small). The bitwise equality is by construction:
 * the same products in the same order, the same k-steps of 16, the same fp32 formulas.
 *
 * Measured there (`attn_bwd_sm90_check` as built in its header, whole backward, B=1,
 * T=4096, 32 heads, causal, cudaEvent over 10 runs, all in the same process; flops =
 * 2.5 × the forward's):
 *   hd 128: 861.4 us = 398.9 TFLOP/s against 1410.9 us = 243.5 for the mma.sync kernels
 *           (wgmma dK/dV with mma.sync dQ: 938.1 us);
 *   hd 64:  634.6 us = 270.7 TFLOP/s against 1015.2 us = 169.2 (with mma.sync dQ 653.8).
 * The passes alone, later in the same run (D left zero; these sum to more than the whole
 * backward above, so read them as a split, not as exact times): hd 128 dK/dV 656.3 us
 * (418.8 TFLOP/s over its 4/5 of the flops), dQ 241.8 us; hd 64 469.1 and 147.4 us.
 * Earlier runs of the same defaults: 858.6 and 862.7 us at hd 128, 635.1 at hd 64.
 * Variants measured in that run (whole backward, hd 128 / hd 64, us), all slower than the
 * defaults and kept only as measured alternatives (the check runs each of them):
 *   dK/dV serial pipeline 874.0 / 651.8; one warpgroup (64 keys) per block, two CTAs per
 *   SM, with the one-warpgroup dQ 911.9 / 717.2; three Q/dO buffers 924.0 / 640.9;
 *   ping-pong issue order (warpgroup 1 issues Sᵀ, dPᵀ after warpgroup 0) 1022.2 / 797.8;
 *   dQ with three stages 913.0 / 649.8.
 * Built with nvcc 13.0 for sm_90a (ptxas -v), no spills anywhere: dK/dV default 242
 * registers at hd 128, 194 at hd 64 (serial 236 / 186); dQ default 134 / 122. Dynamic
 * shared memory: dK/dV 133,120 bytes at hd 128, 67,584 at hd 64; dQ 132,096 / 99,328.
 *
 * ---------------------------------------------------------------- attn_bwd_dkv_ws
 *
 * dK/dV variants 5-8, variant 6 the default since session 4: attn_bwd_dkv_ws, a
 * warp-specialised form of variant 0 fed by TMA (its own comment, further down, has the
 * details): a producer warp loads K and V once and, per (query head, 64-query step), Q and
 * dO by TMA (tensor maps encoded on the host, tma.cuh's make_map_bf16_3d) plus lse·log2 e
 * and D into a ring of NS slots with full / empty mbarriers; the two consumer warpgroups
 * (setmaxnreg 240) run variant 0's products in the same accumulation order, so the
 * results are bitwise those of variant 0 (and of the mma.sync path). No __syncthreads and
 * no cp.async in the loop; the schedule also overlaps what variant 0 serialises: 5, 6
 * (NS 2, 3) issue dV_j, dK_j and the next step's Sᵀ back to back (FA3's order); 8 issues
 * the next step's Sᵀ and dPᵀ right after dK_j; 7 is the plain order of variant 0 with
 * only the copies changed (to separate the two effects).
 * Written without a GPU (session 3; CPU model of the step math and of the mbarrier
 * protocol under random interleavings: tests/gpu/attn_bwd_ws_model.py), first run in
 * session 4 (H200, attn_bwd_sm90_check as built above, benchmarks/RESULTS.md "Session
 * 4"): every case passed the first time, paths 10-13 bitwise equal to path 1 with and
 * without RoPE, no hang; whole backward B=1 T=4096 32 heads (us, same process):
 *   hd 128: variant 0 864.7; 5 825.4, 6 826.5, 7 831.7, 8 827.2 (-4.4%);
 *   hd 64:  variant 0 635.1; 5 545.0, 6 531.9, 7 555.7, 8 549.2 (-16%);
 * dK/dV alone (later, same run): hd 128 variant 0 675.8, 5-8 548.2 / 549.1 / 537.6 /
 * 554.0; hd 64 500.9, 396.0 / 379.7 / 387.0 / 380.6. The pass alone gains more than the
 * whole backward does (read the alone times as a split, as above). compute-sanitizer
 * memcheck (--small): variants 0-4 in session 4, every variant (5-8 too) in session 5;
 * 0 errors.
 * Built with nvcc 13.0 for sm_90a (ptxas -v): every instantiation 168 registers at
 * launch, no spills, no C75xx (wgmma serialisation) advisory; in the SASS (cuobjdump
 * 13.2) the consumers use up to R229 at hd 128 (variants 5, 6; 7: R232; 8: R231) and
 * R175 at hd 64, the producer up to R16 (setmaxnreg 24); 3-4 WARPGROUP.DEPBAR per kernel,
 * exactly the waits in the source (none between k-steps). Dynamic shared memory as
 * attn_bwd_dkv_wgmma's cfg<HD, 2, NS>: 133,120 bytes at hd 128 with two slots, 166,400
 * with three (67,584 / 84,480 at hd 64), plus 1,024 bytes static (ptxas -v; mbarriers).
 *
 * ---------------------------------------------------------------- attn_bwd_dq_ws
 *
 * dQ variants 3-5 (NOT the default: DQ_DEFAULT stays 0, measured below): attn_bwd_dq_ws,
 * a warp-specialised form of dQ variant 0 (attn_bwd_dq_wgmma<HD, 2, 2>; its own comment,
 * further down, has the details). Written in session 4 without a GPU. Why: the dQ pass
 * alone took ~244 us at hd 128, T 4096 (about half its dS-traffic bound) while variant 0
 * copies with cp.async by every thread, meets at a __syncthreads per key tile and waits
 * for every tile's wgmma before loading the next tile's fragments.
 * Here lane 0 of warp 8 loads the K tiles by TMA into a ring of NK slots and lane 0 of
 * warp 9 the dS tiles by 1-d bulk copies (tma.cuh's bulk_load) into a ring of ND slots,
 * each with full / empty mbarriers; a consumer warp releases a dS slot as soon as its
 * fragments are in registers, so the dS stream (the HBM traffic) runs ahead of the K
 * ring. Variants 3 (NK 3, ND 4) and 5 (NK 3, ND 2) also load and transpose the next
 * tile's fragments while the current tile's wgmma runs (two A register sets, wait<1>);
 * 4 (NK 3, ND 4) waits every tile (only the copies change, to separate the effects).
 * Same products in the same order as variant 0 (key tiles 0..qt, k-steps of 16, 4 on
 * the diagonal tile of an even Q), same rope_inv_acc epilogue, same store (dq_store,
 * shared with variant 0), so the bits of variant 0 by construction.
 * Checked without a GPU:
 *  - compiled (nvcc 13.0, sm_90a), ptxas -v: every instantiation 168 registers at launch
 *    (setmaxnreg: producer 24, consumers 240), no spills, no C75xx (wgmma serialisation)
 *    advisory; in the SASS (cuobjdump 13.2) the consumers use up to R188 (variant 3) /
 *    R132 (4) / R192 (5) at hd 128 and R163 / R102 / R164 at hd 64, the producers R0-R18;
 *    WARPGROUP.ARRIVE / DEPBAR 10 / 6 with OV (5 issue sites and 3 waits per warpgroup
 *    path, two paths: 4 and 8 k-steps on the last tile), 4 / 4 without: exactly the
 *    source's; variant 0's SASS after the dq_store refactoring differs only in integer
 *    address arithmetic (the same FP and HGMMA instructions, counted by opcode).
 *    Dynamic shared memory: hd 128 230,400 bytes (NK 3, ND 4) and 164,864 (3, 2); hd 64
 *    181,248 and 115,712; plus 1,024 static (mbarriers; ptxas -v).
 *  - tests/gpu/attn_bwd_dq_ws_model.py (CPU model): products, copies (tiles, addresses,
 *    bytes within what the dK/dV pass wrote) and stored rows against variant 0 for every
 *    T in 1..4096; both rings' mbarrier protocol under random interleavings (rings 3/4,
 *    3/2, 2/2, nwg 1 and 2); three negative cases caught.
 * First run in session 5 (H200, `gpu_session.sh sm90`, benchmarks/RESULTS.md "Session 5"):
 * every case passed the first time, paths 14-16 bitwise equal to path 1 with and without
 * RoPE, no hang, compute-sanitizer memcheck of every variant (--small) 0 errors. The pass
 * alone is faster at hd 128 and slower at hd 64, and the whole backward (B=1, T=4096, 32
 * heads, us, same process) gains nothing, so variant 0 stays the default:
 *   dQ alone, hd 128: variant 0 247.6, 2 239.7; 3 198.8, 4 200.6, 5 191.7;
 *             hd 64:  variant 0 144.5, 2 166.2; 3 161.3, 4 160.5, 5 156.5;
 *   whole backward (dK/dV default), hd 128: dQ 0 780.2; 3 784.2, 4 791.7, 5 794.5;
 *                                   hd 64:  dQ 0 514.6; 3 530.8, 4 529.5, 5 532.3.
 * (Why the faster pass does not shorten the whole backward is not measured; the "alone"
 * times run with D left zero and are read as a split only.)
 * Run them: `attn_bwd_sm90_check` (paths 14-16, "time alone: wgmma dQ variant 3/4/5");
 * `--no-ws` leaves them out.
 *
 * ---------------------------------------------------------------- design
 *
 * Block = (kv head, 128-key tile kt, batch element b0 + z), 256 threads = two warpgroups;
 * warpgroup wg owns keys k0 + 64·wg .. + 63, one m64 wgmma tile, and keeps dK and dV of
 * those keys in registers (m64n{hd} fp32 each). The block visits every query head of the
 * GQA group and every 64-query step at or after k0 (the order of attn_bwd_dkv_kernel:
 * head-major, then query steps), so each dk/dv row has one writer summing in a fixed
 * order: deterministic, no atomics. Per step and warpgroup (rows = keys, columns = the
 * step's 64 queries):
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
 * query step of a head) skips the step and stores nothing: attn_bwd_dq_kernel reads a
 * fragment only when its first key is at or before the reading warp's last query, never
 * for such a step. Keys past T come in as zero rows, are masked on the diagonal steps
 * (the only steps that can hold them) and are never stored; queries past T get lse = +inf
 * (P = 0), D = 0 and zero Q/dO rows.
 *
 * Shared memory, every tile in the 128-byte-swizzled 64-column panels of
 * attention_sm90.cu (chunk c of row r at c ^ (r % 8); a panel of R rows is R·128 bytes,
 * 1024-aligned): K, V [128][hd] (panels of 16 KiB), Q[2], dO[2] [64][hd] (panels of 8 KiB,
 * double-buffered with cp.async), lse·log2 e and D [2][64] fp32: 129 KiB + 1 KiB of
 * alignment slack at hd 128, 65 KiB at hd 64. Descriptors as in attention_sm90.cu:
 * K-major LBO 16, SBO 1024, k-step kk at (kk / 4)·PANEL + (kk % 4)·32 bytes; N-major
 * (tnspB = 1) LBO = the panel stride, SBO 1024, k-step of 16 rows = +2048 bytes. dK and dV
 * leave through the warpgroup's own K and V rows (nobody else reads them), staged in the
 * same layout, as 16-byte row stores.
 *
 * Pipelines (all deterministic, same results bit for bit; DKV_DEFAULT lists them):
 *   OVERLAP (variant 0, the default): issue Sᵀ and dPᵀ together; wait Sᵀ; exp; issue dV;
 *     wait dPᵀ (dV keeps running); dS, its stores; issue dK; wait all.
 *   serial (variant 1): every product waited before the next instruction (debugging).
 * The wait for dK at the end of every step is what a deeper pipeline would remove; it
 * needs a second set of dSᵀ registers (the in-flight dK reads them), which the 242
 * registers at hd 128 leave no room for. Three Q/dO buffers alone (variant 3) did not
 * help, nor did a fixed issue order between the warpgroups (variant 4). What FA3 adds
 * beyond this: a TMA producer warp and mbarriers instead of cp.async by every thread and
 * one __syncthreads per step.
 *
 * dQ (attn_bwd_dq_wgmma and attn_bwd_dq_ws below) has its own comments. */
#include "kernels/cuda/cuda_common.cuh"
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

/* NWG warpgroups per block: 2 (a block owns a 128-key tile, one CTA per SM) or 1 (64
 * keys, two CTAs per SM that drift freely instead of meeting at every step's barrier) */
template <int HD, int NWG, int NS> struct cfg {
    static_assert(HD == 64 || HD == 128, "head_dim 64 or 128");
    static_assert(NWG == 1 || NWG == 2, "one or two warpgroups");
    static_assert(NS == 2 || NS == 3, "Q/dO buffers");
    static constexpr int KROWS = 64 * NWG;                    /* keys of the block */
    static constexpr int KPAN = KROWS * ROW_BYTES;            /* K, V panel */
    static constexpr int KTILE = (HD / 64) * KPAN;
    static constexpr int QTILE = (HD / 64) * QPANEL;
    static constexpr int VEC = 2 * NS * BQ * 4; /* lse, D: [NS][64] fp32 each */
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
 * they are. tab: rope.cu's table, float2 (cos, sin) of pos·theta^(-2f/HD) at
 * [pos·HD/2 + f], 16-byte aligned. For a = column f, b = column f + HD/2:
 *   a' = a·cos + b·sin,  b' = b·cos − a·sin.
 * Shared by every wgmma kernel that stores dq or dk (the dK/dV and dQ epilogues); a new
 * kernel that stores dk or dq must apply it too, or decline when given a table.
 * Checked on an H200 (session 4) by tests/gpu/attn_bwd_sm90_check.cu's RoPE cases: every
 * fused path within 5e-3 relative L2 of the mma.sync backward followed by rope.cu's
 * inverse, and of the float64 rotation; in bench_kernels the fused rotation adds 21.6 us
 * to a 866 us backward at T 4096 where the separate inverse pass took 48.2 us. */
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
 * overwritten. Shared by attn_bwd_dkv_wgmma and attn_bwd_dkv_ws, which apply the
 * inverse RoPE to dk (rope_inv_acc) before calling it. */
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

template <int HD, bool OVERLAP, int NWG, int NS, bool PP>
__global__ void __launch_bounds__(NWG * WG_THREADS, 3 - NWG)
    attn_bwd_dkv_wgmma(bf16 *dqkv, bf16 *dS, size_t ds_head, const bf16 *dout, const bf16 *qkv,
                       const float *lse, const float *Dv, int b0, int T, int nh, int nkv,
                       float scale, float scale_log2, const float2 *rope) {
#if SHLM_WGMMA
    using C = cfg<HD, NWG, NS>;
    constexpr int NT = NWG * WG_THREADS;
    constexpr int NA = HD / 2; /* dK or dV accumulators per thread */
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sK = (raw + 1023u) & ~1023u;
    unsigned char *const gbase = smem_raw + (sK - raw);
    const uint32_t sV = sK + C::KTILE, sQ = sK + 2 * C::KTILE, sO = sQ + NS * C::QTILE;
    float *const lse_b = reinterpret_cast<float *>(gbase + 2 * C::KTILE + 2 * NS * C::QTILE);
    float *const D_b = lse_b + NS * BQ;

    /* kt: the 128-key dS tile; wl: the thread's warpgroup in the block (its rows of the
     * K and V tiles); wgi: that warpgroup's half of the dS tile (keys k0 + 64·wgi..) */
    const int kvh = blockIdx.x, z = blockIdx.z, b = b0 + z;
    const int kt = NWG == 2 ? blockIdx.y : blockIdx.y >> 1;
    const int wl = NWG == 2 ? threadIdx.x >> 7 : 0;
    const int wgi = NWG == 2 ? wl : blockIdx.y & 1;
    const int k0 = kt * BK, kb0 = k0 + (NWG == 2 ? 0 : 64 * wgi); /* the block's first key */
    const int group = nh / nkv;
    const size_t C3 = (size_t)(nh + 2 * nkv) * HD, CO = (size_t)nh * HD;
    const bf16 *const base = qkv + (size_t)b * T * C3;

    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int kg0 = k0 + 64 * wgi;         /* the warpgroup's first key */
    const int kr0 = kg0 + 16 * warp + g;   /* the thread's keys: kr0, kr0 + 8 */

    load_tile<HD, C::KROWS, NT>(sK, base + (size_t)(nh + kvh) * HD, C3, kb0, T);
    load_tile<HD, C::KROWS, NT>(sV, base + (size_t)(nh + nkv + kvh) * HD, C3, kb0, T);

    /* query steps from the block's first key (the first step of a 128-key block has
     * nothing for warpgroup 1, which skips it below) */
    const int nqt = (T - kb0 + BQ - 1) / BQ, nsteps = group * nqt;
    auto issue = [&](int s, int buf) {
        const int h = kvh * group + s / nqt, q0 = kb0 + (s % nqt) * BQ;
        load_tile<HD, BQ, NT>(sQ + buf * C::QTILE, base + (size_t)h * HD, C3, q0, T);
        load_tile<HD, BQ, NT>(sO + buf * C::QTILE, dout + (size_t)b * T * CO + (size_t)h * HD, CO,
                              q0, T);
        if (threadIdx.x < BQ) {
            const int q = q0 + threadIdx.x;
            /* +inf makes every probability of a row past T exactly zero */
            lse_b[buf * BQ + threadIdx.x] =
                q < T ? lse[((size_t)b * nh + h) * T + q] * LOG2E : INFINITY;
            D_b[buf * BQ + threadIdx.x] = q < T ? Dv[((size_t)b * nh + h) * T + q] : 0.0f;
        }
    };
    issue(0, 0);
    cp_async_commit(); /* K, V and step 0 */
    if (NS == 3) {
        if (nsteps > 1) issue(1, 1);
        cp_async_commit(); /* step 1 (perhaps none: the group still counts) */
    }

    /* the warpgroup's K and V rows as A (K-major); the query tiles' descriptors per buffer */
    const uint64_t dKa = make_desc(sK + 64 * wl * ROW_BYTES, 16, 1024);
    const uint64_t dVa = make_desc(sV + 64 * wl * ROW_BYTES, 16, 1024);
    const uint64_t dQk = make_desc(sQ, 16, 1024), dOk = make_desc(sO, 16, 1024);
    const uint64_t dQn = make_desc(sQ, QPANEL, 1024), dOn = make_desc(sO, QPANEL, 1024);

    float dv[NA], dk[NA], s[32], dp[32];
    uint32_t pa[16], sa[16];
#pragma unroll
    for (int i = 0; i < NA; i++) dv[i] = dk[i] = 0.0f;

    /* this lane's place in fragment (4wgi + warp)·4 + 0 of the block's dS tile for query
     * tile 0 of head 0 (per step: + the tile's number · DS_TILE) */
    bf16 *const ds_lane = dS + ((size_t)z * nh * ds_head + kt) * DS_TILE +
                          (size_t)((4 * wgi + warp) * 4) * DS_FRAG + lane * 8;

    for (int step = 0; step < nsteps; step++) {
        const int cur = step % NS;
        const int h = kvh * group + step / nqt, q0 = kb0 + (step % nqt) * BQ;
        /* this step's tiles; everyone is done with step - 1's buffer, which the copies
         * for step + NS - 1 now refill (each step commits one group, perhaps empty) */
        tiles_ready<NS - 2>();
        if (step + NS - 1 < nsteps) issue(step + NS - 1, (step + NS - 1) % NS);
        cp_async_commit();
        if (kg0 > q0 + BQ - 1) continue; /* every key after every query: nothing to do */
        const float *const lse_s = lse_b + cur * BQ, *const D_s = D_b + cur * BQ;
        const uint32_t qoff = cur * C::QTILE;

        /* PP (two warpgroups): warpgroup 1 issues its Sᵀ and dPᵀ only after warpgroup 0
         * has issued its own, so that warpgroup 0's come out first and its exp runs
         * while warpgroup 1's products do (warpgroup 0 is active on every step; it
         * signals only on the steps warpgroup 1 is too) */
        const bool pp = PP && NWG == 2 && kb0 + 64 <= q0 + BQ - 1;
        if (pp && wl == 1) bar_sync(3, 256);
        wgmma_fence();
        gemm_kq<HD, C::KPAN>(s, dKa, desc_add(dQk, qoff));
        wgmma_commit();
        gemm_kq<HD, C::KPAN>(dp, dVa, desc_add(dOk, qoff));
        wgmma_commit();
        if (pp && wl == 0) asm volatile("bar.arrive 3, 256;\n" ::: "memory");
        if constexpr (OVERLAP) wgmma_wait<1>(); /* Sᵀ; dPᵀ may still run */
        else wgmma_wait<0>();
        reg_fence(s);

        const bool diag = kg0 + 63 > q0; /* some key follows some query */
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int qi = 8 * (i >> 2) + 2 * t + (i & 1);
            float p = ex2(fmaf(s[i], scale_log2, -lse_s[qi]));
            if (diag && kr0 + 8 * ((i >> 1) & 1) > q0 + qi) p = 0.0f;
            s[i] = p;
        }
#pragma unroll
        for (int i = 0; i < 16; i++) pa[i] = pack_bf16(s[2 * i], s[2 * i + 1]);

        wgmma_fence();
        gemm_acc<HD>(dv, pa, desc_add(dOn, qoff));
        wgmma_commit();
        if constexpr (OVERLAP) wgmma_wait<1>(); /* dPᵀ; dV may still run */
        else wgmma_wait<0>();
        reg_fence(dp);

#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int qi = 8 * (i >> 2) + 2 * t + (i & 1);
            dp[i] = s[i] * (dp[i] - D_s[qi]) * scale;
        }
#pragma unroll
        for (int i = 0; i < 16; i++) sa[i] = pack_bf16(dp[2 * i], dp[2 * i + 1]);
        bf16 *const ds_out =
            ds_lane + ((size_t)h * ds_head + ds_tile_base(q0 / BQ)) * DS_TILE;
#pragma unroll
        for (int kq = 0; kq < 4; kq++)
            *reinterpret_cast<uint4 *>(ds_out + kq * DS_FRAG) =
                make_uint4(sa[4 * kq], sa[4 * kq + 1], sa[4 * kq + 2], sa[4 * kq + 3]);

        wgmma_fence();
        gemm_acc<HD>(dk, sa, desc_add(dQn, qoff));
        wgmma_commit();
        wgmma_wait<0>(); /* before the next step's barrier lets its buffer be refilled */
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(pa);
        reg_fence(sa);
    }

    /* rope (non-NULL): dk w.r.t. the pre-RoPE k; the thread's rows are keys kr0, kr0 + 8
     * (= kb0 + the rows it stores below) */
    if (rope != nullptr) rope_inv_acc<HD>(dk, rope, kr0, T, t);

    dkv_store<HD, C::KPAN, C::KTILE>(gbase, dk, dv, dqkv, b, T, kb0, C3, nh, nkv, kvh, wl, warp,
                                     lane);
#endif /* SHLM_WGMMA */
}

/* ------------------------------------------------------------------ dK/dV, warp-specialised
 *
 * attn_bwd_dkv_ws (variants 5-8, 6 the default; see the top of the file): the tiles, the
 * products, the order of each product's accumulation and every fp32 formula of
 * attn_bwd_dkv_wgmma<HD, true, 2, 2> (so, by construction, the same bits), with the copies
 * moved to a producer warp fed by TMA, as attention_sm90.cu's attn_fwd_ws: 384 threads =
 * consumer warpgroups 0 and 1 (warps 0-7, keys k0 + 64·wg.., the two warpgroups of
 * attn_bwd_dkv_wgmma) + producer warpgroup 2, of which warp 8 alone works (setmaxnreg:
 * producer 24 registers, consumers 240; 9 warps would cost the register file as much as 12).
 *  - K and V (the block's 128 rows, once): TMA boxes of 64 columns × 128 rows over qkv
 *    (tensor map tm_kv) on one mbarrier kv_full (count 1, expect_tx 2·KTILE);
 *  - per step s (head-major, then 64-query steps from k0, as attn_bwd_dkv_wgmma), ring slot
 *    s % NS: Q (tm_q over qkv) and dO (tm_o over dout), boxes of 64 columns × 64 rows; the
 *    128-byte swizzle of the maps is the panel layout of this file; rows past T arrive as
 *    zeros (TMA's out-of-bounds fill). lse·log2 e and D of the step's 64 queries are
 *    written into the slot by warp 8's 32 lanes with plain loads (issued before the wait
 *    for the slot) and stores (+inf and 0 past T, as load_tile's issue does). full[slot]
 *    has count 32: lane 0 first announces the two tiles' bytes (mbarrier.expect_tx, no
 *    arrival) and issues their TMA, then every lane arrives after its own lse / D stores
 *    (release); empty[slot] has count 8: lane 0 of every consumer
 *    warp, after a __syncwarp, once its warpgroup's products reading the slot were waited
 *    for (predicated arrive, no branch).
 *  - A warpgroup skips the steps attn_bwd_dkv_wgmma skips (warpgroup 1 on the first step
 *    of a head: all its keys after all the queries) and stores no dS for them, but still
 *    waits for each such step's full phase before it releases the slot, so that no warp
 *    arrives twice on one phase of an empty barrier (with nqt = 1 warpgroup 1 skips every
 *    step). The skips happen only where nothing is in flight (see the loop).
 * Schedules XO (per warpgroup; j = step, dV_j = dV += Pᵀ_j·dO_j, dK_j = dK += dSᵀ_j·Q_j):
 *  0 the plain order of attn_bwd_dkv_wgmma: issue Sᵀ_j, dPᵀ_j; wait Sᵀ; exp; issue dV_j;
 *    wait dPᵀ; dSᵀ, its stores; issue dK_j; wait all; release slot j (variant 7);
 *  1 as 0, but after issuing dK_j: wait dV_j, wait for slot j + 1, issue Sᵀ_{j+1},
 *    dPᵀ_{j+1}; the wait for Sᵀ_{j+1} at the top of step j + 1 covers dK_j and releases
 *    slot j. The tensor cores get dK_j, Sᵀ_{j+1}, dPᵀ_{j+1} back to back (variant 8;
 *    an earlier form of the loop spilled with it at hd 128, this one fits: R231);
 *  2 FA3's order: top of step j: wait all (dV_{j-1}, dK_{j-1}, Sᵀ_j), release slot j - 1,
 *    issue dPᵀ_j; exp into fp32 Pᵀ (no bf16 yet) while dPᵀ runs; wait dPᵀ; bf16 Pᵀ and dSᵀ
 *    (the same values: only their packing moves), dS stores; issue dV_j and dK_j; wait for
 *    slot j + 1, issue Sᵀ_{j+1}. Nothing is waited for between dV_j, dK_j and Sᵀ_{j+1};
 *    bf16 Pᵀ no longer lives beside fp32 Pᵀ, dPᵀ and dSᵀ, which is what lets hd 128 fit
 *    in 240 registers (variants 5: two slots, 6: three).
 * The products' accumulation orders do not change with the schedule (each accumulator
 * takes its k-steps and steps in the same order), so all three give the bits of
 * attn_bwd_dkv_wgmma. Pᵀ and dSᵀ are computed into fresh registers, never in place into
 * Sᵀ / dPᵀ: with XO 1 those are loop-carried and a non-wgmma write to them made ptxas
 * serialise everything (C7515). */
constexpr int DKV_WS_THREADS = 384;
constexpr int DKV_WS_PRODUCER_REGS = 24, DKV_WS_CONSUMER_REGS = 240; /* 128·24 + 256·240 <= 65536 */

#if SHLM_WGMMA
#endif /* SHLM_WGMMA */

template <int HD, int NS, int XO>
__global__ void __launch_bounds__(DKV_WS_THREADS, 1)
    attn_bwd_dkv_ws(bf16 *dqkv, bf16 *dS, size_t ds_head, const float *lse, const float *Dv,
                    const __grid_constant__ CUtensorMap tm_kv, const __grid_constant__ CUtensorMap tm_q,
                    const __grid_constant__ CUtensorMap tm_o, int b0, int T, int nh, int nkv,
                    float scale, float scale_log2, const float2 *rope) {
#if SHLM_WGMMA
    using namespace shlm_tma;
    using C = cfg<HD, 2, NS>;
    static_assert(XO >= 0 && XO <= 2, "schedules 0-2");
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
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(bars);
    const uint32_t kv_full = bar0;
    auto full = [&](int s) { return bar0 + 8u * (1 + s); };
    auto empty = [&](int s) { return bar0 + 8u * (1 + NS + s); };

    const int kvh = blockIdx.x, kt = blockIdx.y, z = blockIdx.z, b = b0 + z;
    const int k0 = kt * BK;
    const int group = nh / nkv;
    const size_t C3 = (size_t)(nh + 2 * nkv) * HD;
    /* query steps from the block's first key, head-major (as attn_bwd_dkv_wgmma) */
    const int nqt = (T - k0 + BQ - 1) / BQ, nsteps = group * nqt;
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
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int q = q0 + lane + 32 * e;
                lv[e] = q < T ? lse[row + q] * LOG2E : INFINITY;
                dv[e] = q < T ? Dv[row + q] : 0.0f;
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
            }
            mbar_arrive(full(slot)); /* release: this lane's stores above */
            if (++qs == nqt) qs = 0, hi++;
        }
        return;
    }

    /* the consumers: warpgroup wl of attn_bwd_dkv_wgmma<HD, true, 2, 2> */
    setmaxnreg_inc<DKV_WS_CONSUMER_REGS>();
    const int wl = warp_all >> 2, warp = warp_all & 3;
    const int g = lane >> 2, t = lane & 3;
    const int kg0 = k0 + 64 * wl;        /* the warpgroup's first key */
    const int kr0 = kg0 + 16 * warp + g; /* the thread's keys: kr0, kr0 + 8 */

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

    /* The schedules (XO; see the comment above the kernel): 0 the plain order, 1 step
     * j + 1's Sᵀ and dPᵀ issued right after dK_j, 2 dV_j, dK_j and step j + 1's Sᵀ issued
     * together, dPᵀ at the top of step j + 1. A step is carried into the next (its slot
     * released at the top of the next) only when the next is this warpgroup's too;
     * otherwise it ends waiting for everything, skips, then issues the next step's first
     * products: every wgmma issue in a branch is reached with nothing in flight, which is
     * what keeps ptxas from serialising them (C7518 with a skip test inside the loop). */
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
    bool carried = false; /* XO != 0: step - 1's dK in flight, its slot not yet released */
    mbar_wait(kv_full, 0);
    skip_steps();
    if (step == nsteps) goto done; /* warpgroup 1 of a block with nqt = 1 */
    if constexpr (XO != 0) {
        slot_ready(step);
        issue_s(step);
        if constexpr (XO == 1) issue_dp(step);
    }
    for (;;) {
        const int slot = step % NS;
        const int h = kvh * group + hi, q0 = k0 + qs * BQ;
        if (++qs == nqt) qs = 0, hi++;
        const uint32_t qoff = slot * C::QTILE;
        if constexpr (XO == 0) {
            slot_ready(step);
            issue_s(step);
            issue_dp(step);
            wgmma_wait<1>(); /* Sᵀ; dPᵀ may still run */
        } else if constexpr (XO == 1) {
            wgmma_wait<1>(); /* step - 1's dV, dK, Sᵀ; dPᵀ may still run */
        } else {
            wgmma_wait<0>(); /* step - 1's dV, dK, Sᵀ */
            issue_dp(step);
        }
        reg_fence(s);
        if constexpr (XO == 2) {
            reg_fence(dv);
            reg_fence(dk);
            reg_fence(pa);
            reg_fence(sa);
        }
        /* step - 1's slot, when its products were still in flight at the end of it (the
         * other path released it there, and skipped steps release their own) */
        if constexpr (XO != 0) release((step + NS - 1) % NS, carried);
        const float *const lse_s = lse_b + slot * BQ, *const D_s = D_b + slot * BQ;

        /* Pᵀ into pf, dSᵀ straight into sa, never in place: with Sᵀ and dPᵀ of the next
         * step issued at the end of this one, s and dp are loop-carried, and a non-wgmma
         * write to them made ptxas serialise every wgmma (C7515). pf takes s's registers. */
        float pf[32];
        const bool diag = kg0 + 63 > q0; /* some key follows some query */
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int qi = 8 * (i >> 2) + 2 * t + (i & 1);
            float p = ex2(fmaf(s[i], scale_log2, -lse_s[qi]));
            if (diag && kr0 + 8 * ((i >> 1) & 1) > q0 + qi) p = 0.0f;
            pf[i] = p;
        }
        if constexpr (XO != 2) {
#pragma unroll
            for (int i = 0; i < 16; i++) pa[i] = pack_bf16(pf[2 * i], pf[2 * i + 1]);
            wgmma_fence();
            gemm_acc<HD>(dv, pa, desc_add(dOn, qoff));
            wgmma_commit();
            wgmma_wait<1>(); /* dPᵀ; dV may still run */
        } else {
            wgmma_wait<0>(); /* dPᵀ */
        }
        reg_fence(dp);

#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int qi = 8 * (i >> 1) + 2 * t; /* of element 2i; 2i + 1 is qi + 1 */
            if constexpr (XO == 2) pa[i] = pack_bf16(pf[2 * i], pf[2 * i + 1]);
            sa[i] = pack_bf16(pf[2 * i] * (dp[2 * i] - D_s[qi]) * scale,
                              pf[2 * i + 1] * (dp[2 * i + 1] - D_s[qi + 1]) * scale);
        }
        /* (a step of this warpgroup has keys at or before some query: stored always; the
         * test is kept, a predicated store, for the steps attn_bwd_dkv_wgmma stores) */
        if (kg0 <= q0 + BQ - 1) {
            bf16 *const ds_out = ds_lane + ((size_t)h * ds_head + ds_tile_base(q0 / BQ)) * DS_TILE;
#pragma unroll
            for (int kq = 0; kq < 4; kq++)
                *reinterpret_cast<uint4 *>(ds_out + kq * DS_FRAG) =
                    make_uint4(sa[4 * kq], sa[4 * kq + 1], sa[4 * kq + 2], sa[4 * kq + 3]);
        }

        if constexpr (XO == 2) {
            wgmma_fence();
            gemm_acc<HD>(dv, pa, desc_add(dOn, qoff));
            wgmma_commit();
        }
        wgmma_fence();
        gemm_acc<HD>(dk, sa, desc_add(dQn, qoff));
        wgmma_commit();
        if constexpr (XO != 0) {
            if (step + 1 < nsteps && kg0 <= k0 + qs * BQ + BQ - 1) {
                if constexpr (XO != 2) {
                    wgmma_wait<1>(); /* dV; dK may still run */
                    reg_fence(dv);
                    reg_fence(pa);
                }
                slot_ready(step + 1);
                issue_s(step + 1);
                if constexpr (XO == 1) issue_dp(step + 1);
                step++;
                carried = true;
                continue;
            }
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
        if constexpr (XO != 0) {
            slot_ready(step);
            issue_s(step);
            if constexpr (XO == 1) issue_dp(step);
        }
    }
done:
    /* rope (non-NULL): dk w.r.t. the pre-RoPE k, as in attn_bwd_dkv_wgmma; the thread's
     * rows are keys k0 + 64·wl + 16·warp + (lane >> 2) (+ 8) */
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
 * attn_bwd_dq_wgmma and attn_bwd_dq_ws. */
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

template <int HD, int NWG, int NS> struct dqcfg {
    static_assert(NS == 2 || NS == 3, "stages");
    static constexpr int KTILE = (HD / 64) * KPANEL;
    static constexpr int STAGE = KTILE + NWG * DS_TILE * 2; /* K rows, NWG dS tiles */
    static constexpr int SMEM = NS * STAGE + 1024;
};

/* dQ = dS·K, the same work as attention.cu's attn_bwd_dq_kernel on wgmma. Block (head,
 * 128-query tile qt, batch element b0 + z), longest first; warpgroup wg owns the 64-query
 * dS tile Q = 2qt + wg. Over key tiles 0..qt in order (deterministic), each stage copies
 * (cp.async, double-buffered) the 128 K rows into a swizzled tile and the two dS tiles
 * (Q, kt) as they are (16 KiB each); warp w loads its fragments kk·4 + w (its 16 queries ×
 * keys 16kk..), transposes their quarters with movmatrix into register-A fragments of dS
 * and the warpgroup runs dq += dS·K (rs m64n{hd}k16, K N-major as V in the forward). On
 * the diagonal tile of an even Q only keys 0-63 count: the dK/dV pass did not write the
 * rest (its keys all follow the queries). dQ leaves through an unused stage. NWG = 1: one
 * warpgroup (one dS tile) per block, two CTAs per SM; NS = 3: copies two steps ahead
 * (both measured slower, see the top of the file). An estimate, not a measurement: the
 * pass moves about 2·nh·T² bytes (the dS tiles, nh·T² bytes, once from HBM; as many K
 * bytes, mostly from L2), 1.1 GB at T = 4096 and 32 heads; the dS half alone takes
 * ~115 us at the H200's 4.8 TB/s, so this pass is bound by memory, not by wgmma. */
template <int HD, int NWG, int NS>
__global__ void __launch_bounds__(NWG * WG_THREADS, 3 - NWG)
    attn_bwd_dq_wgmma(bf16 *dqkv, const bf16 *dS, size_t ds_head, const bf16 *qkv, int b0, int T,
                      int nh, int nkv, const float2 *rope) {
#if SHLM_WGMMA
    using C = dqcfg<HD, NWG, NS>;
    constexpr int NT = NWG * WG_THREADS;
    constexpr int NA = HD / 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t s0 = (raw + 1023u) & ~1023u;
    unsigned char *const g0 = smem_raw + (s0 - raw);

    /* yq: the block's tile of 64·NWG queries, longest first; qt: the 128-query tile it is
     * in; Qb: its first 64-query dS tile */
    const int h = blockIdx.x, yq = gridDim.y - 1 - blockIdx.y, z = blockIdx.z, b = b0 + z;
    const int qt = NWG == 2 ? yq : yq >> 1, Qb = NWG == 2 ? 2 * yq : yq;
    const int kvh = h / (nh / nkv);
    const int q0 = Qb * BQ;
    const size_t C3 = (size_t)(nh + 2 * nkv) * HD;
    const bf16 *const kbase = qkv + (size_t)b * T * C3 + (size_t)(nh + kvh) * HD;
    const bf16 *const dsh = dS + ((size_t)z * nh + h) * ds_head * DS_TILE;
    const int nq64 = (T + BQ - 1) / BQ;
    const int nsteps = qt + 1; /* key tiles 0..qt: 128·qt <= q0 < T */
    auto issue = [&](int s) {
        const uint32_t st = s0 + (s % NS) * C::STAGE;
        load_tile<HD, BK, NT>(st, kbase, C3, s * BK, T);
#pragma unroll
        for (int qh = 0; qh < NWG; qh++) {
            const int Q = Qb + qh;
            if (Q >= nq64) break;
            const bf16 *const src = dsh + (ds_tile_base(Q) + s) * DS_TILE;
            const uint32_t dst = st + C::KTILE + qh * DS_TILE * 2;
            /* the diagonal tile of an even Q: only fragments 0-15 (keys 0-63) were written
             * by the dK/dV pass, and only they are read (dq_tile<HD, 4>) */
            const int n16 = (s == qt && (Q & 1) == 0) ? DS_TILE / 16 : DS_TILE / 8;
#pragma unroll 4
            for (int i = threadIdx.x; i < n16; i += NT)
                cp_async16(dst + 16 * i, src + 8 * i, true);
        }
    };
    issue(0);
    cp_async_commit();
    if (NS == 3) {
        if (nsteps > 1) issue(1);
        cp_async_commit(); /* (perhaps empty: the group still counts) */
    }

    const int wl = NWG == 2 ? threadIdx.x >> 7 : 0; /* the warpgroup in the block */
    const int Q = Qb + wl;                           /* its dS tile of 64 queries */
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const bool active = Q < nq64; /* the warpgroup has queries */
    float dq[NA];
#pragma unroll
    for (int i = 0; i < NA; i++) dq[i] = 0.0f;

    for (int s = 0; s < nsteps; s++) {
        /* stage s; everyone is done with stage s-1's buffer, which the copies for stage
         * s + NS - 1 now refill (each step commits one group, perhaps empty) */
        tiles_ready<NS - 2>();
        if (s + NS - 1 < nsteps) issue(s + NS - 1);
        cp_async_commit();
        if (!active) continue;
        const int off = (s % NS) * C::STAGE;
        const unsigned char *const fr =
            g0 + off + C::KTILE + wl * DS_TILE * 2 + warp * DS_FRAG * 2 + lane * 16;
        const uint64_t dk = make_desc(s0 + off, KPANEL, 1024);
        if (s == qt && (Q & 1) == 0) dq_tile<HD, 4>(dq, fr, dk);
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

/* ------------------------------------------------------------------ dQ, warp-specialised
 *
 * attn_bwd_dq_ws (dQ variants 3-5; see the top of the file): the blocks, the products and
 * their accumulation order of attn_bwd_dq_wgmma<HD, 2, 2> (so, by construction, the same
 * bits), with the copies moved to producer warps and mbarrier rings, as attn_bwd_dkv_ws:
 * 384 threads = consumer warpgroups 0 and 1 (warps 0-7: warpgroup wl the 64-query dS tile
 * Q = 2qt + wl, as attn_bwd_dq_wgmma) + producer warpgroup 2, of which lane 0 of warp 8
 * and lane 0 of warp 9 work (setmaxnreg: producer 24, consumers 240).
 *  - K ring, NK slots (warp 8): per step (key tile) s = 0..qt, the 128 K rows s·128..
 *    by TMA (tensor map tm_k over qkv, boxes 64 columns × 128 rows, the panels of
 *    load_tile; rows past T arrive as zeros) into slot s % NK; kfull[slot] count 1
 *    (arrive.expect_tx), kempty[slot] count 4·nwg (lane 0 of every active consumer warp,
 *    once its warpgroup's product reading the slot was waited for).
 *  - dS ring, ND slots (warp 9): per step s the dS tiles (Q, s) of the block's active
 *    warpgroups (Q < nq64), each one 1-d bulk copy from dsh + (ds_tile_base(Q) + s)·DS_TILE,
 *    the addresses attn_bwd_dq_wgmma copies from; of the diagonal tile of an even Q
 *    (s == qt, warpgroup 0) only the first half (fragments 0-15: keys 0-63), the only
 *    part it reads and the only part the dK/dV pass wrote. dfull[slot] count 1, dempty
 *    [slot] count 4·nwg: a consumer warp releases a dS slot as soon as its fragments of
 *    the step are in registers (the fragments are not read by the wgmma from shared
 *    memory), so the dS ring (the HBM stream) runs ahead of the K ring by itself.
 *  - consumers (warpgroup wl; nwg = 2, or 1 when 2qt + 1 >= nq64, the other warpgroup
 *    leaving at once): per step, wait dfull, load the warp's 16-byte fragments kk·4 + warp
 *    and transpose them with movmatrix (as dq_tile), release the dS slot, wait kfull, issue
 *    dq += dS·K (rs m64n{hd}k16 × 8, or × 4 on warpgroup 0's last step: the diagonal rule
 *    s == qt && Q even of attn_bwd_dq_wgmma; Q = 2qt + wl is even exactly for wl = 0).
 *    OV (variants 3, 5): two sets of A registers; step s + 1's fragments are loaded and
 *    transposed while step s's wgmma runs (wait<1> after issuing s: step s - 1 is done,
 *    its A registers and its K slot free); the last step is issued after the loop body
 *    in a branch per parity (the loop is unrolled by two so that the register sets are
 *    fixed names). !OV (variant 4): one set, wait<0> after every step (only the copies
 *    differ from attn_bwd_dq_wgmma).
 *  - dq leaves through the warpgroup's own dS tile region of the last step's dS slot
 *    (nothing else reads it; every copy into that slot has landed; the producer issues
 *    none after the last step), after a named barrier of the warpgroup, by dq_store.
 * tests/gpu/attn_bwd_dq_ws_model.py models the index math and both rings' protocol. */
constexpr int DQ_WS_THREADS = 384;
constexpr int DQ_WS_PRODUCER_REGS = 24, DQ_WS_CONSUMER_REGS = 240; /* 128·24 + 256·240 <= 65536 */

template <int HD, int NK, int ND> struct dqwscfg {
    static_assert(HD == 64 || HD == 128, "head_dim 64 or 128");
    static_assert(NK >= 2 && ND >= 2, "rings of two slots at least");
    static constexpr int KTILE = (HD / 64) * KPANEL; /* 128 K rows */
    static constexpr int DTILE = 2 * DS_TILE * 2;    /* the two warpgroups' dS tiles */
    static constexpr int SMEM = NK * KTILE + ND * DTILE + 1024;
};

template <int N> struct ic {
    static constexpr int value = N;
};

template <int HD, int NK, int ND, bool OV>
__global__ void __launch_bounds__(DQ_WS_THREADS, 1)
    attn_bwd_dq_ws(bf16 *dqkv, const bf16 *dS, size_t ds_head,
                   const __grid_constant__ CUtensorMap tm_k, int b0, int T, int nh, int nkv,
                   const float2 *rope) {
#if SHLM_WGMMA
    using namespace shlm_tma;
    using C = dqwscfg<HD, NK, ND>;
    constexpr int NA = HD / 2, NP = HD / 64;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t bars[2 * NK + 2 * ND];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sK = (raw + 1023u) & ~1023u, sD = sK + NK * C::KTILE;
    unsigned char *const gD = smem_raw + (sD - raw);
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(bars);
    auto kfull = [&](int i) { return bar0 + 8u * i; };
    auto kempty = [&](int i) { return bar0 + 8u * (NK + i); };
    auto dfull = [&](int i) { return bar0 + 8u * (2 * NK + i); };
    auto dempty = [&](int i) { return bar0 + 8u * (2 * NK + ND + i); };

    /* the block of attn_bwd_dq_wgmma<HD, 2, NS>: 128-query tile qt, longest first */
    const int h = blockIdx.x, qt = gridDim.y - 1 - blockIdx.y, z = blockIdx.z, b = b0 + z;
    const int Qb = 2 * qt, q0 = Qb * BQ;
    const int kvh = h / (nh / nkv);
    const size_t C3 = (size_t)(nh + 2 * nkv) * HD;
    const bf16 *const dsh = dS + ((size_t)z * nh + h) * ds_head * DS_TILE;
    const int nq64 = (T + BQ - 1) / BQ;
    const int nsteps = qt + 1;                 /* key tiles 0..qt */
    const int nwg = Qb + 1 < nq64 ? 2 : 1;    /* warpgroups with queries */
    const int lane = threadIdx.x & 31, warp_all = threadIdx.x >> 5;

    if (threadIdx.x == 0) {
        for (int i = 0; i < NK; i++) {
            mbar_init(kfull(i), 1);
            mbar_init(kempty(i), 4 * nwg);
        }
        for (int i = 0; i < ND; i++) {
            mbar_init(dfull(i), 1);
            mbar_init(dempty(i), 4 * nwg);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (warp_all >= 8) { /* the producer warpgroup: lane 0 of warps 8 (K) and 9 (dS) */
        setmaxnreg_dec<DQ_WS_PRODUCER_REGS>();
        if (lane != 0 || warp_all > 9) return;
        if (warp_all == 8) {
            tma_prefetch_desc(&tm_k);
            for (int s = 0; s < nsteps; s++) {
                const int slot = s % NK, u = s / NK;
                if (u > 0) mbar_wait(kempty(slot), (u - 1) & 1); /* step s - NK done */
                mbar_arrive_expect_tx(kfull(slot), C::KTILE);
#pragma unroll
                for (int p = 0; p < NP; p++)
                    tma_load_3d(sK + slot * C::KTILE + p * KPANEL, &tm_k, kfull(slot),
                                (nh + kvh) * HD + 64 * p, s * BK, b);
            }
        } else {
            for (int s = 0; s < nsteps; s++) {
                const int slot = s % ND, u = s / ND;
                /* warpgroup 0's diagonal tile: its first half only */
                const uint32_t n0 = s == qt ? DS_TILE : 2 * DS_TILE, n1 = 2 * DS_TILE;
                if (u > 0) mbar_wait(dempty(slot), (u - 1) & 1); /* step s - ND's fragments loaded */
                mbar_arrive_expect_tx(dfull(slot), nwg == 2 ? n0 + n1 : n0);
                const uint32_t dst = sD + slot * C::DTILE;
                bulk_load(dst, dsh + (ds_tile_base(Qb) + s) * DS_TILE, n0, dfull(slot));
                if (nwg == 2)
                    bulk_load(dst + DS_TILE * 2, dsh + (ds_tile_base(Qb + 1) + s) * DS_TILE, n1,
                              dfull(slot));
            }
        }
        return;
    }

    /* the consumers */
    setmaxnreg_inc<DQ_WS_CONSUMER_REGS>();
    const int wl = warp_all >> 2, warp = warp_all & 3;
    if (wl >= nwg) return; /* warpgroup 1 without queries */
    const int g = lane >> 2, t = lane & 3;
    /* this lane's 16 bytes of fragment 0·4 + warp of the warpgroup's dS tile, slot 0 */
    const unsigned char *const fr0 = gD + wl * DS_TILE * 2 + warp * DS_FRAG * 2 + lane * 16;

    float dq[NA];
#pragma unroll
    for (int i = 0; i < NA; i++) dq[i] = 0.0f;
    reg_fence(dq);

    /* step s's A fragments (its first N k-steps) into a, then the warp's release of the
     * dS slot (every lane's loads are behind the __syncwarp; a predicated arrive) */
    auto load = [&](uint32_t(&a)[32], int s, auto n) {
        constexpr int N = decltype(n)::value;
        const int slot = s % ND;
        mbar_wait(dfull(slot), (s / ND) & 1);
        const unsigned char *const fr = fr0 + slot * C::DTILE;
#pragma unroll
        for (int kk = 0; kk < N; kk++) {
            const uint4 v = *reinterpret_cast<const uint4 *>(fr + kk * 4 * DS_FRAG * 2);
            a[4 * kk] = movm_trans(v.x); /* as dq_tile */
            a[4 * kk + 1] = movm_trans(v.z);
            a[4 * kk + 2] = movm_trans(v.y);
            a[4 * kk + 3] = movm_trans(v.w);
        }
        __syncwarp();
        mbar_arrive_if(dempty(slot), lane == 0);
    };
    /* dq += dS·K over step s's first N k-steps, one commit group */
    auto issue = [&](const uint32_t(&a)[32], int s, auto n) {
        constexpr int N = decltype(n)::value;
        const int slot = s % NK;
        mbar_wait(kfull(slot), (s / NK) & 1);
        const uint64_t dk = make_desc(sK + slot * C::KTILE, KPANEL, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < N; kk++) {
            const uint64_t d = desc_add(dk, kk * 16 * ROW_BYTES);
            if constexpr (HD == 128) wgmma_rs_n128_t(dq, &a[4 * kk], d);
            else wgmma_rs_n64_t(dq, &a[4 * kk], d);
        }
        wgmma_commit();
    };
    /* step s's product was waited for: its K slot goes back (predicated, no branch) */
    auto release_k = [&](int s, bool pred) {
        __syncwarp();
        mbar_arrive_if(kempty((s + NK) % NK), lane == 0 && pred);
    };

    /* the k-steps of the last step: 4 on warpgroup 0 (the diagonal tile of an even Q),
     * else 8; one code path per warpgroup, chosen where nothing is in flight */
    auto run = [&](auto nlast) {
        uint32_t a0[32], a1[32];
        if constexpr (OV) {
            if (nsteps == 1) {
                load(a0, 0, nlast);
                issue(a0, 0, nlast);
            } else {
                load(a0, 0, ic<8>());
                for (int s = 0;; s += 2) { /* a0: step s, not the last */
                    issue(a0, s, ic<8>());
                    wgmma_wait<1>(); /* step s - 1 */
                    reg_fence(a1);
                    release_k(s - 1, s > 0);
                    if (s + 2 == nsteps) {
                        load(a1, s + 1, nlast);
                        issue(a1, s + 1, nlast);
                        break;
                    }
                    load(a1, s + 1, ic<8>());
                    issue(a1, s + 1, ic<8>());
                    wgmma_wait<1>(); /* step s */
                    reg_fence(a0);
                    release_k(s, true);
                    if (s + 3 == nsteps) {
                        load(a0, s + 2, nlast);
                        issue(a0, s + 2, nlast);
                        break;
                    }
                    load(a0, s + 2, ic<8>());
                }
            }
        } else {
            for (int s = 0; s + 1 < nsteps; s++) {
                load(a0, s, ic<8>());
                issue(a0, s, ic<8>());
                wgmma_wait<0>();
                reg_fence(a0);
                release_k(s, true);
            }
            load(a0, nsteps - 1, nlast);
            issue(a0, nsteps - 1, nlast);
        }
        wgmma_wait<0>();
        reg_fence(dq);
        reg_fence(a0);
        reg_fence(a1);
    };
    if (wl == 0) run(ic<4>());
    else run(ic<8>());

    /* rope (non-NULL): dq w.r.t. the pre-RoPE q, as attn_bwd_dq_wgmma */
    if (rope != nullptr) rope_inv_acc<HD>(dq, rope, q0 + 64 * wl + 16 * warp + g, T, t);
    /* every warp of the warpgroup has loaded its last fragments before any overwrites the
     * region: the warpgroup's own dS tile in the last step's dS slot */
    bar_sync(1 + wl, WG_THREADS);
    dq_store<HD, QPANEL>(gD + ((nsteps - 1) % ND) * C::DTILE + wl * DS_TILE * 2, dq,
                         dqkv + ((size_t)b * T + q0 + 64 * wl) * C3 + (size_t)h * HD,
                         T - q0 - 64 * wl, C3, warp, lane);
#endif /* SHLM_WGMMA */
}

/* ------------------------------------------------------------------ host side */


template <int HD, bool OVERLAP, int NWG, int NS, bool PP = false>
void launch(bf16 *dqkv, bf16 *dS, size_t ds_head, const bf16 *dout, const bf16 *qkv,
            const float *lse, const float *Dv, int b0, int nb, int T, int nh, int nkv, float scale,
            float scale_log2, const float2 *rope) {
    using C = cfg<HD, NWG, NS>;
    static bool done = false;
    if (!done) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkv_wgmma<HD, OVERLAP, NWG, NS, PP>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
        done = true;
    }
    dim3 grid(nkv, (T + C::KROWS - 1) / C::KROWS, nb);
    attn_bwd_dkv_wgmma<HD, OVERLAP, NWG, NS, PP><<<grid, NWG * WG_THREADS, C::SMEM, shlm_cuda_stream()>>>(
        dqkv, dS, ds_head, dout, qkv, lse, Dv, b0, T, nh, nkv, scale, scale_log2, rope);
    CUDA_CHECK_LAST();
}

/* attn_bwd_dkv_ws: three tensor maps (K/V boxes of 128 rows and Q boxes of 64 over qkv,
 * dO boxes of 64 over dout), each covering batch elements 0..b0+nb-1; false (nothing
 * queued) when the driver cannot encode them */
template <int HD, int NS, int XO>
bool launch_ws(bf16 *dqkv, bf16 *dS, size_t ds_head, const bf16 *dout, const bf16 *qkv,
               const float *lse, const float *Dv, int b0, int nb, int T, int nh, int nkv,
               float scale, float scale_log2, const float2 *rope) {
    using C = cfg<HD, 2, NS>;
    static_assert(C::SMEM + 1024 <= 227 * 1024, "dynamic + static shared memory per block");
    const size_t C3 = (size_t)(nh + 2 * nkv) * HD, CO = (size_t)nh * HD;
    CUtensorMap tm_kv, tm_q, tm_o;
    if (!shlm_tma_host::make_map_bf16_3d(&tm_kv, qkv, C3, T, b0 + nb, BK) ||
        !shlm_tma_host::make_map_bf16_3d(&tm_q, qkv, C3, T, b0 + nb, BQ) ||
        !shlm_tma_host::make_map_bf16_3d(&tm_o, dout, CO, T, b0 + nb, BQ))
        return false;
    static bool done = false;
    if (!done) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkv_ws<HD, NS, XO>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
        done = true;
    }
    dim3 grid(nkv, (T + BK - 1) / BK, nb);
    attn_bwd_dkv_ws<HD, NS, XO><<<grid, DKV_WS_THREADS, C::SMEM, shlm_cuda_stream()>>>(
        dqkv, dS, ds_head, lse, Dv, tm_kv, tm_q, tm_o, b0, T, nh, nkv, scale, scale_log2, rope);
    CUDA_CHECK_LAST();
    return true;
}

/* dK/dV pipelines: 0 two warpgroups, overlapped, Q/dO double-buffered; 1 the same,
 * serial; 2 one warpgroup (64 keys) per block, overlapped; 3 as 0 with three Q/dO buffers
 * (copies two steps ahead); 4 as 0 with warpgroup 1 issuing after warpgroup 0 (PP);
 * attn_bwd_dkv_ws (TMA producer warp, mbarrier ring; see the top of the file): 5 two
 * slots, schedule XO 2 (FA3's order); 6 three slots, XO 2; 7 two slots, XO 0 (the plain
 * order of 0); 8 two slots, XO 1. A variant 5-8 declines (returns 1, nothing queued) when
 * the tensor maps cannot be made; the plain entry then runs variant 0.
 * DKV_DEFAULT: what the plain entry runs (6: the fastest whole backward at both head
 * dims in session 4's run, bitwise equal to 0). */
constexpr int DKV_DEFAULT = 6;

template <int HD>
bool dkv_hd(int variant, bf16 *d, bf16 *s, size_t ds_head, const bf16 *g, const bf16 *x,
            const float *lse, const float *Dv, int b0, int nb, int T, int nh, int nkv, float scale,
            float scale_log2, const float2 *rp) {
    if (variant == 5) return launch_ws<HD, 2, 2>(d, s, ds_head, g, x, lse, Dv, b0, nb, T, nh, nkv, scale, scale_log2, rp);
    if (variant == 6) return launch_ws<HD, 3, 2>(d, s, ds_head, g, x, lse, Dv, b0, nb, T, nh, nkv, scale, scale_log2, rp);
    if (variant == 7) return launch_ws<HD, 2, 0>(d, s, ds_head, g, x, lse, Dv, b0, nb, T, nh, nkv, scale, scale_log2, rp);
    if (variant == 8) return launch_ws<HD, 2, 1>(d, s, ds_head, g, x, lse, Dv, b0, nb, T, nh, nkv, scale, scale_log2, rp);
    if (variant == 1) launch<HD, false, 2, 2>(d, s, ds_head, g, x, lse, Dv, b0, nb, T, nh, nkv, scale, scale_log2, rp);
    else if (variant == 2) launch<HD, true, 1, 2>(d, s, ds_head, g, x, lse, Dv, b0, nb, T, nh, nkv, scale, scale_log2, rp);
    else if (variant == 3) launch<HD, true, 2, 3>(d, s, ds_head, g, x, lse, Dv, b0, nb, T, nh, nkv, scale, scale_log2, rp);
    else if (variant == 4) launch<HD, true, 2, 2, true>(d, s, ds_head, g, x, lse, Dv, b0, nb, T, nh, nkv, scale, scale_log2, rp);
    else launch<HD, true, 2, 2>(d, s, ds_head, g, x, lse, Dv, b0, nb, T, nh, nkv, scale, scale_log2, rp);
    return true;
}

int dkv(void *dqkv, void *dS, size_t ds_head, const void *dout, const void *qkv, const float *lse,
        const float *Dv, int b0, int nb, int T, int nh, int nkv, int hd, float scale,
        float scale_log2, int variant, const void *rope) {
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
    const bool ok =
        hd == 128 ? dkv_hd<128>(variant, d, s, ds_head, g, x, lse, Dv, b0, nb, T, nh, nkv, scale, scale_log2, rp)
                  : dkv_hd<64>(variant, d, s, ds_head, g, x, lse, Dv, b0, nb, T, nh, nkv, scale, scale_log2, rp);
    return ok ? 0 : 1;
}

template <int HD, int NWG, int NS>
void launch_dq(bf16 *dqkv, const bf16 *dS, size_t ds_head, const bf16 *qkv, int b0, int nb, int T,
               int nh, int nkv, const float2 *rope) {
    using C = dqcfg<HD, NWG, NS>;
    static bool done = false;
    if (!done) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_wgmma<HD, NWG, NS>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
        done = true;
    }
    dim3 grid(nh, (T + 64 * NWG - 1) / (64 * NWG), nb);
    attn_bwd_dq_wgmma<HD, NWG, NS><<<grid, NWG * WG_THREADS, C::SMEM, shlm_cuda_stream()>>>(
        dqkv, dS, ds_head, qkv, b0, T, nh, nkv, rope);
    CUDA_CHECK_LAST();
}

/* attn_bwd_dq_ws: one tensor map (K boxes of 128 rows over qkv, batch elements
 * 0..b0+nb-1); false (nothing queued) when the driver cannot encode it */
template <int HD, int NK, int ND, bool OV>
bool launch_dq_ws(bf16 *dqkv, const bf16 *dS, size_t ds_head, const bf16 *qkv, int b0, int nb,
                  int T, int nh, int nkv, const float2 *rope) {
    using C = dqwscfg<HD, NK, ND>;
    static_assert(C::SMEM + 1024 <= 227 * 1024, "dynamic + static shared memory per block");
    const size_t C3 = (size_t)(nh + 2 * nkv) * HD;
    CUtensorMap tm_k;
    if (!shlm_tma_host::make_map_bf16_3d(&tm_k, qkv, C3, T, b0 + nb, BK)) return false;
    static bool done = false;
    if (!done) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_ws<HD, NK, ND, OV>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
        done = true;
    }
    dim3 grid(nh, (T + BK - 1) / BK, nb);
    attn_bwd_dq_ws<HD, NK, ND, OV><<<grid, DQ_WS_THREADS, C::SMEM, shlm_cuda_stream()>>>(
        dqkv, dS, ds_head, tm_k, b0, T, nh, nkv, rope);
    CUDA_CHECK_LAST();
    return true;
}

/* dQ: 0 two warpgroups (128 queries) per block, two stages; 1 one warpgroup (64
 * queries), two stages; 2 two warpgroups, three stages (copies two steps ahead);
 * attn_bwd_dq_ws (producer warps: K by TMA, dS by 1-d bulk copies, mbarrier rings; see
 * the top of the file; checked and measured in session 5, no faster in the whole
 * backward): 3 K ring of 3 slots, dS ring of 4, the
 * next step's fragments loaded while the current step's wgmma runs (OV); 4 the same
 * rings, every step waited (only the copies differ from 0); 5 K ring 3, dS ring 2, OV.
 * A variant 3-5 declines (returns 1, nothing queued) when the tensor map cannot be made.
 * DQ_DEFAULT: what the plain entry runs. */
constexpr int DQ_DEFAULT = 0;

template <int HD>
bool dq_hd(int variant, bf16 *d, const bf16 *s, size_t ds_head, const bf16 *x, int b0, int nb,
           int T, int nh, int nkv, const float2 *rp) {
    if (variant == 3) return launch_dq_ws<HD, 3, 4, true>(d, s, ds_head, x, b0, nb, T, nh, nkv, rp);
    if (variant == 4) return launch_dq_ws<HD, 3, 4, false>(d, s, ds_head, x, b0, nb, T, nh, nkv, rp);
    if (variant == 5) return launch_dq_ws<HD, 3, 2, true>(d, s, ds_head, x, b0, nb, T, nh, nkv, rp);
    if (variant == 1) launch_dq<HD, 1, 2>(d, s, ds_head, x, b0, nb, T, nh, nkv, rp);
    else if (variant == 2) launch_dq<HD, 2, 3>(d, s, ds_head, x, b0, nb, T, nh, nkv, rp);
    else launch_dq<HD, 2, 2>(d, s, ds_head, x, b0, nb, T, nh, nkv, rp);
    return true;
}

int dq(void *dqkv, const void *dS, size_t ds_head, const void *qkv, int b0, int nb, int T, int nh,
       int nkv, int hd, int variant, const void *rope) {
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
    const bool ok = hd == 128 ? dq_hd<128>(variant, d, s, ds_head, x, b0, nb, T, nh, nkv, rp)
                              : dq_hd<64>(variant, d, s, ds_head, x, b0, nb, T, nh, nkv, rp);
    return ok ? 0 : 1;
}

} // namespace sm90b
} // namespace

/* 0: queued (dk, dv rows of batch elements b0..b0+nb-1 and their dS tiles); 1: not
 * handled (shape, alignment, device or build), nothing queued. variant: see DKV_DEFAULT. */
extern "C" int shlm_cuda_attention_bwd_dkv_sm90_variant(void *dqkv, void *dS, size_t ds_head,
                                                        const void *dout, const void *qkv,
                                                        const float *lse, const float *D, int b0,
                                                        int nb, int T, int nh, int nkv, int hd,
                                                        float scale, float scale_log2,
                                                        int variant, const void *rope) {
    return sm90b::dkv(dqkv, dS, ds_head, dout, qkv, lse, D, b0, nb, T, nh, nkv, hd, scale,
                      scale_log2, variant, rope);
}

extern "C" int shlm_cuda_attention_bwd_dkv_sm90(void *dqkv, void *dS, size_t ds_head,
                                                const void *dout, const void *qkv,
                                                const float *lse, const float *D, int b0, int nb,
                                                int T, int nh, int nkv, int hd, float scale,
                                                float scale_log2, const void *rope) {
    int rc = sm90b::dkv(dqkv, dS, ds_head, dout, qkv, lse, D, b0, nb, T, nh, nkv, hd, scale,
                        scale_log2, sm90b::DKV_DEFAULT, rope);
    if (rc != 0 && sm90b::DKV_DEFAULT >= 5) /* no tensor maps (driver entry point): cp.async */
        rc = sm90b::dkv(dqkv, dS, ds_head, dout, qkv, lse, D, b0, nb, T, nh, nkv, hd, scale,
                        scale_log2, 0, rope);
    return rc;
}

/* 0: queued (the dq rows of batch elements b0..b0+nb-1, from the dS tiles of the pass);
 * 1: not handled, nothing queued. variant: see DQ_DEFAULT. */
extern "C" int shlm_cuda_attention_bwd_dq_sm90_variant(void *dqkv, const void *dS, size_t ds_head,
                                                       const void *qkv, int b0, int nb, int T,
                                                       int nh, int nkv, int hd, int variant,
                                                       const void *rope) {
    return sm90b::dq(dqkv, dS, ds_head, qkv, b0, nb, T, nh, nkv, hd, variant, rope);
}

extern "C" int shlm_cuda_attention_bwd_dq_sm90(void *dqkv, const void *dS, size_t ds_head,
                                               const void *qkv, int b0, int nb, int T, int nh,
                                               int nkv, int hd, const void *rope) {
    return sm90b::dq(dqkv, dS, ds_head, qkv, b0, nb, T, nh, nkv, hd, sm90b::DQ_DEFAULT, rope);
}
