/* cuda backend causal grouped-query flash attention on tensor cores (mma.sync bf16, fp32
 * accumulation): the T×T scores never exist; the backward recomputes P from the lse. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/attention_doc.cuh"

#include <math.h>
#include <string.h>

/* Shapes (ops.h): qkv (B·T, (nh + 2·nkv)·hd) rows hold [q heads | k heads | v heads];
 * out (B·T, nh·hd); lse (B, nh, T) fp32, natural log; query head h reads kv head
 * h / (nh/nkv).
 *
 * Products use mma.m16n8k16 (A 16×16 row-major, B 16×8 column-major, C 16×8 fp32). In
 * the C fragment, lane (g = lane/4, t = lane%4) holds rows g and g+8, columns 2t and 2t+1
 * of each 8-wide n-tile; the A fragment has the same rows and columns 2t, 2t+1, 2t+8,
 * 2t+9 of each 16-wide k-step. So a row of probabilities computed into C fragments is,
 * packed to bf16, already the A fragment of the next product: P never leaves registers.
 * Every fragment is read from shared memory with ldmatrix (x4: four 8×8 matrices per
 * instruction; .trans when the stored rows run along k).
 *
 * Each warp owns 32 rows (two m16 tiles) of its block's tile, so every B fragment read
 * from shared memory feeds two products: half the shared-memory traffic per product of
 * 16-row warps, whose shared-memory reads bound them (forward 721 against 464 us on an
 * H200, B=1, T=4096, 32 heads of 128).
 *
 * The head dimension is padded with zeros to HDP ∈ {16, 32, 64, 128} (a zero column
 * adds nothing to q·k and produces an output column nobody stores), so any hd ≤ 128
 * works; hd % 8 == 0 (every Llama) takes 16-byte loads and stores, others go element by
 * element. Tiles are staged in shared memory with rows padded by 8 elements (16 bytes):
 * with that stride the ldmatrix row reads hit 32 distinct banks. Tiles stream in through
 * cp.async, double-buffered: the copy of tile i+1 is issued right after the barrier that
 * starts tile i, so it overlaps tile i's products, and one barrier per tile suffices.
 * Results leave through shared memory as 16-byte row stores. Scores are kept in the log2
 * domain (scaled by log2 e, folded into one FFMA) so that exp is a bare ex2.
 *
 * Causality: key tiles after a query tile's last row are never visited, a warp skips
 * the tiles that are fully masked for its own 32 rows, and only tiles that straddle the
 * diagonal apply the mask. Blocks are ordered longest first over the whole grid.
 * Documents (DOC, doc_start non-NULL; the rules of attention_doc.cuh): the same for the
 * tiles before a row's first key: never visited before the query tile's first row's
 * first key, skipped by a warp before its own first row's, masked element-wise where a
 * tile starts before its last row's. DOC = false is the plain causal kernel, unchanged. */

namespace {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

/* ------------------------------------------------------------------ primitives */

__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0,
                                          uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8×8 bf16 matrices: lanes 8i..8i+7 give the row addresses of matrix i; register i
 * receives matrix i's elements, lane (g, t) holding row g, columns 2t and 2t+1. */
__device__ __forceinline__ void ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                        const bf16 *p) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* The same, transposed: register i receives matrix i's rows 2t, 2t+1 of column g —
 * exactly a B fragment when the stored rows run along k (keys of V, queries of dO). */
__device__ __forceinline__ void ldsm_x4_trans(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                              uint32_t &r3, const bf16 *p) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* Transposes an 8×8 bf16 matrix held in C-fragment form (lane (g, t): row g, columns 2t,
 * 2t+1) in registers: lane (g, t) receives row g, columns 2t, 2t+1 of the transpose. */
__device__ __forceinline__ uint32_t movm_trans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* Lane offsets (elements) into a shared tile of row stride SS, for ldmatrix.x4:
 *  a_off: the A fragment of the 16 rows × 16 columns at the offset added to it;
 *  b_off: the B fragments of two adjacent n-tiles (16 stored rows) × one k-step (16
 *         stored columns), stored n-major (K for Q·Kᵀ): registers b0, b1 of n-tile 0,
 *         then b0, b1 of n-tile 1;
 *  t_off: (.trans) the B fragments of one k-step (16 stored rows) × two adjacent n-tiles
 *         (16 stored columns), stored k-major (V for P·V): same register order. */
template <int SS> __device__ __forceinline__ int a_off(int lane) {
    return (lane & 15) * SS + (lane >> 4) * 8;
}
template <int SS> __device__ __forceinline__ int b_off(int lane) {
    return ((lane & 7) + ((lane >> 4) & 1) * 8) * SS + ((lane >> 3) & 1) * 8;
}
template <int SS> __device__ __forceinline__ int t_off(int lane) {
    return ((lane & 7) + ((lane >> 3) & 1) * 8) * SS + (lane >> 4) * 8;
}

/* Writes a warp's 32-row accumulator (two m16 tiles of C fragments over HDP columns),
 * row i scaled by mul[i/16][(i/8)%2], as bf16 into rows row0.. of a shared tile. */
template <int HDP>
__device__ __forceinline__ void stage_acc(bf16 *s, const float (&acc)[2][HDP / 8][4],
                                          const float (&mul)[2][2], int row0, int lane) {
    constexpr int SS = HDP + 8;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            bf16 *p = s + (row0 + 16 * mt + 8 * r + g) * SS + 2 * t;
#pragma unroll
            for (int d = 0; d < HDP / 8; d++)
                *reinterpret_cast<uint32_t *>(p + 8 * d) =
                    pack_bf16(acc[mt][d][2 * r] * mul[mt][r], acc[mt][d][2 * r + 1] * mul[mt][r]);
        }
    }
}

/* Copies rows < nrows, columns < hd of a shared tile (row stride HDP + 8) to global
 * memory (row stride ld): 16 bytes at a time with vec, else element by element. */
template <int ROWS, int HDP, int NTHR>
__device__ __forceinline__ void store_tile(bf16 *g, size_t ld, const bf16 *s, int nrows, int hd,
                                           bool vec) {
    constexpr int SS = HDP + 8;
    if (vec) {
        constexpr int CH = HDP / 8;
        for (int i = threadIdx.x; i < ROWS * CH; i += NTHR) {
            const int r = i / CH, c = (i % CH) * 8;
            if (r < nrows && c < hd)
                *reinterpret_cast<uint4 *>(g + (size_t)r * ld + c) =
                    *reinterpret_cast<const uint4 *>(s + r * SS + c);
        }
    } else {
        for (int i = threadIdx.x; i < ROWS * HDP; i += NTHR) {
            const int r = i / HDP, c = i % HDP;
            if (r < nrows && c < hd) g[(size_t)r * ld + c] = s[r * SS + c];
        }
    }
}

/* ------------------------------------------------------------------ warp products */

/* Zeroes a warp's 32 rows × N n-tiles of C fragments (two m16 tiles). */
template <int N> __device__ __forceinline__ void zero_frags(float (&c)[2][N][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < N; j++) c[mt][j][0] = c[mt][j][1] = c[mt][j][2] = c[mt][j][3] = 0.0f;
}

/* c += A·B over KS k-steps with both operands in shared tiles (row stride SS): A the
 * warp's 32 rows at a (a_off applied), B stored n-major at b (b_off applied: K for
 * Q·Kᵀ), N n-tiles. Each B fragment read feeds both m16 tiles. */
template <int N, int KS, int SS>
__device__ __forceinline__ void mma_smem_nmajor(float (&c)[2][N][4], const bf16 *a, const bf16 *b) {
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t fa[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
            ldsm_x4(fa[mt][0], fa[mt][1], fa[mt][2], fa[mt][3], a + mt * 16 * SS + kk * 16);
#pragma unroll
        for (int jj = 0; jj < N / 2; jj++) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4(b0, b1, b2, b3, b + jj * 16 * SS + kk * 16);
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                mma_16816(c[mt][2 * jj], fa[mt], b0, b1);
                mma_16816(c[mt][2 * jj + 1], fa[mt], b2, b3);
            }
        }
    }
}

/* The A fragment of k-step kk from C fragments: n-tiles 2kk and 2kk+1, packed to bf16
 * (the C layout of two n-tiles is the A layout of one k-step; see the top of the file). */
template <int N>
__device__ __forceinline__ void pack_a_frags(uint32_t (&a)[2][4], const float (&c)[2][N][4],
                                             int kk) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        a[mt][0] = pack_bf16(c[mt][2 * kk][0], c[mt][2 * kk][1]);
        a[mt][1] = pack_bf16(c[mt][2 * kk][2], c[mt][2 * kk][3]);
        a[mt][2] = pack_bf16(c[mt][2 * kk + 1][0], c[mt][2 * kk + 1][1]);
        a[mt][3] = pack_bf16(c[mt][2 * kk + 1][2], c[mt][2 * kk + 1][3]);
    }
}

/* c += a·B for one k-step: a the warp's A fragments in registers, B the k-step's 16
 * stored rows, k-major, at b (t_off applied: read with ldmatrix.trans), DT n-tiles. */
template <int DT>
__device__ __forceinline__ void mma_regs_kmajor(float (&c)[2][DT][4], const uint32_t (&a)[2][4],
                                                const bf16 *b) {
#pragma unroll
    for (int d = 0; d < DT; d += 2) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_trans(b0, b1, b2, b3, b + d * 8);
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            mma_16816(c[mt][d], a[mt], b0, b1);
            mma_16816(c[mt][d + 1], a[mt], b2, b3);
        }
    }
}

/* ------------------------------------------------------------------ forward */

/* Scores of a warp's 32 rows (C fragments of NT 8-key n-tiles from key k0) become -inf
 * where the key lies after (AFTER) or before the row's bound (bound[mt][r]: the row of
 * m-tile mt, half r of the fragment). */
template <bool AFTER, int NT>
__device__ __forceinline__ void mask_keys(float (&s)[2][NT][4], int k0, const int (&bound)[2][2],
                                          int t) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int k = k0 + 8 * j + 2 * t + (e & 1);
                if (AFTER ? k > bound[mt][e >> 1] : k < bound[mt][e >> 1]) s[mt][j][e] = -INFINITY;
            }
}

constexpr int FWD_THREADS = 128; /* 4 warps */
constexpr int FWD_BR = 128;      /* queries per block: 32 per warp */
constexpr int FWD_BC = 64;       /* keys per step (32 measured 10% slower) */

/* Block (head, query tile, batch). Online softmax over key tiles 0..(last tile the query
 * tile sees): running max m and sum l per row, O rescaled by exp2(m_old − m_new) as m
 * grows. Q stays in shared memory (its fragments are re-read per key tile: 32 rows of Q
 * plus 64 keys of K and V per warp and tile). K/V tiles are double-buffered. */
template <int HDP, bool DOC>
__global__ void __launch_bounds__(FWD_THREADS)
    attn_fwd_kernel(bf16 *out, float *lse, const bf16 *qkv, int T, int nh, int nkv, int hd,
                    float scale_log2, bool vec, bool ovec, const int32_t *doc) {
    constexpr int SS = HDP + 8, KS = HDP / 16, DT = HDP / 8, NT = FWD_BC / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *const Qs = reinterpret_cast<bf16 *>(smem_raw); /* [FWD_BR][SS] */
    bf16 *const Kb = Qs + FWD_BR * SS;                    /* [2][FWD_BC][SS] */
    bf16 *const Vb = Kb + 2 * FWD_BC * SS;                /* [2][FWD_BC][SS] */

    const int h = blockIdx.x, qt = gridDim.y - 1 - blockIdx.y, b = blockIdx.z;
    const int kvh = h / (nh / nkv);
    const int q0 = qt * FWD_BR;
    const size_t C3 = (size_t)(nh + 2 * nkv) * hd, CO = (size_t)nh * hd;
    const bf16 *base = qkv + (size_t)b * T * C3;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wq0 = q0 + warp * 32; /* the warp's first row */
    int qrow[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) qrow[mt][r] = wq0 + 16 * mt + 8 * r + g;

    const bf16 *const kbase = base + (size_t)(nh + kvh) * hd;
    const bf16 *const vbase = base + (size_t)(nh + nkv + kvh) * hd;
    const int nq = min(FWD_BR, T - q0);
    /* DOC: the first key tile any row of the block sees; each row's first key (rows past T
     * take the last row's: first keys grow with the row, so qlo[0][0] is the least of the
     * thread's and qlo[1][1] the greatest) */
    const int kt0 = DOC ? doc_first_key(doc, b, T, q0) / FWD_BC : 0;
    int qlo[2][2];
    if constexpr (DOC) {
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                qlo[mt][r] = doc_first_key(doc, b, T, min(qrow[mt][r], T - 1));
    }

    load_tile<FWD_BR, HDP, FWD_THREADS>(Qs, base + (size_t)q0 * C3 + (size_t)h * hd, C3, nq, hd,
                                        vec);
    load_tile<FWD_BC, HDP, FWD_THREADS>(Kb, kbase + (size_t)kt0 * FWD_BC * C3, C3,
                                        min(FWD_BC, T - kt0 * FWD_BC), hd, vec);
    load_tile<FWD_BC, HDP, FWD_THREADS>(Vb, vbase + (size_t)kt0 * FWD_BC * C3, C3,
                                        min(FWD_BC, T - kt0 * FWD_BC), hd, vec);
    cp_async_commit();

    float o[2][DT][4];
    zero_frags(o);
    float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
    float l[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};

    const bf16 *const qfrag = Qs + warp * 32 * SS + a_off<SS>(lane);
    const int koff = b_off<SS>(lane), voff = t_off<SS>(lane);
    const int kt_end = min((q0 + FWD_BR - 1) / FWD_BC, (T - 1) / FWD_BC);

    for (int kt = kt0; kt <= kt_end; kt++) {
        const int buf = (kt - kt0) & 1;
        cp_async_wait_all(); /* tile kt (and Q) */
        __syncthreads();     /* ...visible to all; everyone is done with tile kt-1's buffer */
        if (kt < kt_end) {
            const int k1 = (kt + 1) * FWD_BC;
            load_tile<FWD_BC, HDP, FWD_THREADS>(Kb + (buf ^ 1) * FWD_BC * SS,
                                                kbase + (size_t)k1 * C3, C3, min(FWD_BC, T - k1),
                                                hd, vec);
            load_tile<FWD_BC, HDP, FWD_THREADS>(Vb + (buf ^ 1) * FWD_BC * SS,
                                                vbase + (size_t)k1 * C3, C3, min(FWD_BC, T - k1),
                                                hd, vec);
            cp_async_commit();
        }
        const int k0 = kt * FWD_BC;
        if (k0 > wq0 + 31) continue; /* every key after every row of this warp */
        /* every key before every row's first key */
        if (DOC && __all_sync(0xffffffffu, k0 + FWD_BC - 1 < qlo[0][0])) continue;
        const bool diag = k0 + FWD_BC - 1 > wq0;
        const bf16 *const Ks = Kb + buf * FWD_BC * SS, *const Vs = Vb + buf * FWD_BC * SS;

        /* S = Q·Kᵀ: B(k = dim, n = key) = K[key][dim] */
        float s[2][NT][4];
        zero_frags(s);
        mma_smem_nmajor<NT, KS, SS>(s, qfrag, Ks + koff);
        if (diag) mask_keys<true>(s, k0, qrow, t);
        /* DOC: some key before some row's first */
        if (DOC && __any_sync(0xffffffffu, k0 < qlo[1][1])) mask_keys<false>(s, k0, qlo, t);
        float mref[2][2], alpha[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < NT; j++)
                    mx = fmaxf(mx, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mn = fmaxf(m[mt][r], mx * scale_log2); /* scale > 0 */
                /* -inf while every key the row has seen was masked (DOC: tiles before its
                 * first key); it sees its own key on the diagonal */
                mref[mt][r] = mn == -INFINITY ? 0.0f : mn;
                alpha[mt][r] = ex2(m[mt][r] - mref[mt][r]);
                m[mt][r] = mn;
                l[mt][r] *= alpha[mt][r];
            }
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float p = ex2(fmaf(s[mt][j][e], scale_log2, -mref[mt][e >> 1]));
                    s[mt][j][e] = p;
                    l[mt][e >> 1] += p; /* this thread's columns; the quad is summed at the end */
                }
        /* once a row's max settles (most tiles of a long row) alpha is exactly 1: skip the
         * rescale when it is for all of the warp's rows */
        if (__any_sync(0xffffffffu, alpha[0][0] != 1.0f || alpha[0][1] != 1.0f ||
                                        alpha[1][0] != 1.0f || alpha[1][1] != 1.0f)) {
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int d = 0; d < DT; d++) {
                    o[mt][d][0] *= alpha[mt][0];
                    o[mt][d][1] *= alpha[mt][0];
                    o[mt][d][2] *= alpha[mt][1];
                    o[mt][d][3] *= alpha[mt][1];
                }
        }
        /* O += P·V: P's C fragments of n-tiles 2kk, 2kk+1 form the A fragment of k-step
         * kk; V's B fragments come from ldmatrix.trans (V is stored key-major) */
#pragma unroll
        for (int kk = 0; kk < FWD_BC / 16; kk++) {
            uint32_t pa[2][4];
            pack_a_frags(pa, s, kk);
            mma_regs_kmajor(o, pa, Vs + kk * 16 * SS + voff);
        }
    }

    float inv[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lr = l[mt][r];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            inv[mt][r] = 1.0f / lr;
            const int q = qrow[mt][r];
            if (t == 0 && q < T) lse[((size_t)b * nh + h) * T + q] = (m[mt][r] + log2f(lr)) * LN2;
        }
    __syncthreads(); /* every warp is done reading Q: its buffer stages O */
    stage_acc<HDP>(Qs, o, inv, warp * 32, lane);
    __syncthreads();
    store_tile<FWD_BR, HDP, FWD_THREADS>(out + ((size_t)b * T + q0) * CO + (size_t)h * hd, CO, Qs,
                                         nq, hd, ovec);
}

/* ------------------------------------------------------------------ backward */

/* D[b,h,t] = Σ_d dO·O: the softmax Jacobian's row term. 2^lg lanes per (row, head): with
 * vec (hd % 8 == 0, 16-byte aligned rows; 8·2^lg ≥ hd) each reads 8 elements of both
 * rows with two 16-byte loads, otherwise (2^lg = 32) every 32nd element. */
__global__ void attn_bwd_d_kernel(float *Dv, const bf16 *dout, const bf16 *out, int B, int T,
                                  int nh, int hd, int lg, bool vec) {
    const size_t n = (size_t)B * T * nh;
    const size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> lg;
    const int sub = threadIdx.x & ((1 << lg) - 1);
    float s = 0.0f;
    if (w < n) { /* no early return: the whole warp shuffles below */
        const size_t row = w / nh;
        const int h = (int)(w % nh);
        const bf16 *a = dout + row * nh * hd + (size_t)h * hd;
        const bf16 *o = out + row * nh * hd + (size_t)h * hd;
        if (vec) {
            if (8 * sub < hd) {
                float x[8], y[8];
                load_bf16x8(x, a + 8 * sub);
                load_bf16x8(y, o + 8 * sub);
#pragma unroll
                for (int i = 0; i < 8; i++) s = fmaf(x[i], y[i], s);
            }
        } else {
            for (int d = sub; d < hd; d += 32) s += __bfloat162float(a[d]) * __bfloat162float(o[d]);
        }
    }
    for (int off = (1 << lg) >> 1; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (sub == 0 && w < n) {
        const size_t row = w / nh, b = row / T, tt = row % T;
        Dv[(b * nh + (int)(w % nh)) * T + tt] = s;
    }
}

/* The backward is deterministic without float atomics: every output row has one writer,
 * which sums in a fixed order. After D, two kernels:
 *  - dK/dV, block (kv head, 128-key tile): recomputes Pᵀ and dPᵀ, accumulates dV += Pᵀ·dO
 *    and dK += dSᵀ·Q, and writes dS (bf16: the very values its dK product used) to a
 *    scratch buffer, for the causal tiles only;
 *  - dQ, block (head, 128-query tile): dQ = Σ over key tiles, in order, of dS·K.
 * That is 5 products per tile pair, as in a flash-attention backward with atomic dQ,
 * instead of the 7 of recomputing S and dP for dQ; the price is writing and reading dS
 * once (2 bytes per causal pair and head), cheap next to the two products it saves
 * (the whole backward 1411 against 1766 us recomputing, B=1, T=4096, 32 heads of 128).
 *
 * dS scratch, per (batch element of the pass, head): the tiles of 64 queries (query tile
 * Q) × 128 keys (key tile kt), kt ≤ Q/2 — the (key tile, query step) pairs the dK/dV
 * kernel visits — query tile after query tile: tile (Q, kt) is number ds_tile_base(Q) +
 * kt. A tile is 32 fragments of 512 bytes, one uint4 per lane in lane order: fragment
 * kk·4 + qm is the 16 keys (16kk..) × 16 queries (16qm..) of dSᵀ exactly as the dK/dV
 * kernel holds them as the A operand of dK += dSᵀ·Q. So that kernel stores each with one
 * 16-byte store per lane (a warp writes 512 contiguous bytes), the dQ kernel copies tiles
 * with plain 16-byte cp.async, reads a lane's fragment with one conflict-free 16-byte
 * shared load and transposes its four 8×8 quarters with movmatrix into the A fragment of
 * dS. (Transposing in the dK/dV kernel instead costs registers there, in the bottleneck
 * kernel: 57 us slower there for 15 us gained here.) */

/* 128 keys × 64 queries per block measured fastest of 128 × {32, 48, 64} and 64 × {32, 48}
 * (two blocks per SM). */
constexpr int KV_BK = 128;             /* keys per block: 32 per warp pair */
constexpr int KV_NS = KV_BK / 32;      /* key slices (warp pairs) */
constexpr int KV_THREADS = 64 * KV_NS; /* 2 warps (roles) per slice */
constexpr int KV_BQ = 64;              /* queries per step */

constexpr int DS_TILE = KV_BK * KV_BQ; /* elements of one dS tile */
constexpr int DS_FRAG = 256;           /* elements of one 16×16 A fragment */
/* batch elements share one pass (one dS scratch) while their dS fits this: small T gets
 * full grids, long T takes one element at a time and a scratch of about nh·T² bytes */
constexpr size_t DS_PASS_BYTES = (size_t)256 << 20;

/* Tiles of query tiles 0..Q-1: query tile q has key tiles 0..q/2. */
__host__ __device__ __forceinline__ size_t ds_tile_base(int Q) {
    const size_t m = (size_t)(Q >> 1);
    return (Q & 1) ? (m + 1) * (m + 1) : m * (m + 1);
}

/* dK, dV (and dS). Block (kv head, key tile, batch element b0 + z) owns those keys'
 * dk/dv rows and visits every query head of the group and every query tile at or after
 * the key tile: it is the only writer of its rows, and sums in a fixed order.
 *
 * Warps w and w+4 share key slice w (32 keys) and split the work: warp w ("P") computes
 * Sᵀ = K·Qᵀ and Pᵀ = exp2(Sᵀ·c − lse₂), hands Pᵀ (fp32, in its fragment order) to its
 * partner through shared memory, and accumulates dV += Pᵀ·dO; warp w+4 ("dS") computes
 * dPᵀ = V·dOᵀ, then dSᵀ = Pᵀ ∘ (dPᵀ − D)·scale, accumulates dK += dSᵀ·Q and stores dS.
 * Each warp holds one 32×HDP accumulator and reads every B fragment for 32 keys. The
 * steps (query head, query tile) run as one sequence whose Q/dO/lse/D tiles are
 * double-buffered. A dS warp whose keys all follow the step's queries skips the step and
 * stores nothing: the dQ kernel never reads those fragments. DOC: the steps end with the
 * last one that starts before doc_query_end (attention_doc.cuh), and Pᵀ is 0 where the
 * key precedes the query's first key (lo_b, one per query, beside lse and D). */
template <int HDP, bool DOC>
__global__ void __launch_bounds__(KV_THREADS, KV_NS <= 2 ? 2 : 1)
    attn_bwd_dkv_kernel(bf16 *dqkv, bf16 *dS, size_t ds_head, const bf16 *dout,
                        const bf16 *qkv, const float *lse, const float *Dv, int b0, int T,
                        int nh, int nkv, int hd, float scale, float scale_log2, bool vec,
                        bool vec_do, bool ovec, const int32_t *doc) {
    constexpr int SS = HDP + 8, KS = HDP / 16, DT = HDP / 8, QT = KV_BQ / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *const Ks = reinterpret_cast<bf16 *>(smem_raw); /* [KV_BK][SS] */
    bf16 *const Vs = Ks + KV_BK * SS;                     /* [KV_BK][SS] */
    bf16 *const Qb = Vs + KV_BK * SS;                     /* [2][KV_BQ][SS] */
    bf16 *const dOb = Qb + 2 * KV_BQ * SS;                /* [2][KV_BQ][SS] */
    float4 *const Pex = reinterpret_cast<float4 *>(dOb + 2 * KV_BQ * SS); /* [KV_NS][2·QT][32] */
    float *const lse_b = reinterpret_cast<float *>(Pex + KV_NS * 2 * QT * 32); /* [2][KV_BQ] */
    float *const D_b = lse_b + 2 * KV_BQ;                                  /* [2][KV_BQ] */
    int *const lo_b = reinterpret_cast<int *>(D_b + 2 * KV_BQ); /* DOC: [2][KV_BQ] */

    const int kvh = blockIdx.x, kt = blockIdx.y, b = b0 + blockIdx.z;
    const int k0 = kt * KV_BK;
    const int group = nh / nkv;
    const size_t C3 = (size_t)(nh + 2 * nkv) * hd, CO = (size_t)nh * hd;
    const bf16 *base = qkv + (size_t)b * T * C3;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int kw = warp % KV_NS;         /* key slice */
    const bool ds_role = warp >= KV_NS; /* warp-uniform */
    const int klo = k0 + 32 * kw;   /* the slice's first key */
    int krow[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) krow[mt][r] = klo + 16 * mt + 8 * r + g;
    const int nk = min(KV_BK, T - k0);
    /* this lane's place in fragments kk·4 + 0 of the slice's first key step (kk = 2kw) */
    bf16 *const ds_lane = dS + ((size_t)blockIdx.z * nh * ds_head + kt) * DS_TILE +
                          (size_t)(8 * kw) * DS_FRAG + lane * 8;

    load_tile<KV_BK, HDP, KV_THREADS>(Ks, base + (size_t)k0 * C3 + (size_t)(nh + kvh) * hd, C3,
                                      nk, hd, vec);
    load_tile<KV_BK, HDP, KV_THREADS>(Vs, base + (size_t)k0 * C3 + (size_t)(nh + nkv + kvh) * hd,
                                      C3, nk, hd, vec);

    /* queries before k0 see none of these keys, nor (DOC) those from q_end on: tiles from
     * k0 to q_end, for each head */
    const int q_end = DOC ? doc_query_end(doc, b, T, k0 + KV_BK - 1) : T;
    const int nqt = (q_end - k0 + KV_BQ - 1) / KV_BQ, nsteps = group * nqt;
    /* starts step s's copies into buffer `buf` (lse and D by plain loads) */
    auto issue = [&](int s, int buf) {
        const int h = kvh * group + s / nqt, q0 = k0 + (s % nqt) * KV_BQ;
        const int nq = min(KV_BQ, T - q0);
        load_tile<KV_BQ, HDP, KV_THREADS>(Qb + buf * KV_BQ * SS,
                                          base + (size_t)q0 * C3 + (size_t)h * hd, C3, nq, hd, vec);
        load_tile<KV_BQ, HDP, KV_THREADS>(dOb + buf * KV_BQ * SS,
                                          dout + ((size_t)b * T + q0) * CO + (size_t)h * hd, CO,
                                          nq, hd, vec_do);
        if (threadIdx.x < KV_BQ) {
            const int q = q0 + threadIdx.x;
            /* +inf makes every probability of a row past T exactly zero */
            lse_b[buf * KV_BQ + threadIdx.x] =
                q < T ? lse[((size_t)b * nh + h) * T + q] * LOG2E : INFINITY;
            D_b[buf * KV_BQ + threadIdx.x] = q < T ? Dv[((size_t)b * nh + h) * T + q] : 0.0f;
            if (DOC) lo_b[buf * KV_BQ + threadIdx.x] = q < T ? doc_first_key(doc, b, T, q) : T;
        }
    };
    issue(0, 0);
    cp_async_commit(); /* K, V and step 0 */

    float acc[2][DT][4]; /* dV (P warps) or dK (dS warps) of the slice's 32 keys */
    zero_frags(acc);

    /* A operand of the first product: K (P warps) or V (dS warps), the slice's rows */
    const bf16 *const afrag = (ds_role ? Vs : Ks) + kw * 32 * SS + a_off<SS>(lane);
    const int boff = b_off<SS>(lane), toff = t_off<SS>(lane);
    float4 *const pex = Pex + kw * 2 * QT * 32 + lane;

    for (int step = 0; step < nsteps; step++) {
        const int cur = step & 1;
        const int q0 = k0 + (step % nqt) * KV_BQ;
        cp_async_wait_all(); /* this step's tiles */
        __syncthreads();     /* ...visible; everyone is done with the other buffer and Pex */
        if (step + 1 < nsteps) {
            issue(step + 1, cur ^ 1);
            cp_async_commit();
        }
        const bf16 *const Qs = Qb + cur * KV_BQ * SS, *const dOs = dOb + cur * KV_BQ * SS;
        const float *const lse_s = lse_b + cur * KV_BQ, *const D_s = D_b + cur * KV_BQ;
        const int *const lo_s = lo_b + cur * KV_BQ;
        const bool active = klo <= q0 + KV_BQ - 1; /* some query sees some key of the slice */
        const bool diag = klo + 31 > q0;           /* some query precedes some key */
        const bool before = DOC && klo < lo_s[KV_BQ - 1]; /* some key precedes some first key */

        /* x: Sᵀ then Pᵀ (P warps) or dPᵀ then dSᵀ (dS warps); rows = keys, cols = queries */
        float x[2][QT][4];
        if (active) {
            zero_frags(x);
            /* B(k = dim, n = query) = Q[query][dim] or dO[query][dim] */
            mma_smem_nmajor<QT, KS, SS>(x, afrag, (ds_role ? dOs : Qs) + boff);
            if (!ds_role) {
                /* DOC: per key row, the first query of the step whose first key follows it
                 * (first keys grow with the query: a binary search of lo_s; KV_BQ: none) */
                int cut[2][2] = {{KV_BQ, KV_BQ}, {KV_BQ, KV_BQ}};
                if (before) {
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            int c = 0;
#pragma unroll
                            for (int half = KV_BQ / 2; half > 0; half >>= 1)
                                if (lo_s[c + half - 1] <= krow[mt][r]) c += half;
                            cut[mt][r] = lo_s[c] <= krow[mt][r] && c == KV_BQ - 1 ? KV_BQ : c;
                        }
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int j = 0; j < QT; j++) {
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int qi = 8 * j + 2 * t + (e & 1);
                            float p = ex2(fmaf(x[mt][j][e], scale_log2, -lse_s[qi]));
                            if (diag && krow[mt][e >> 1] > q0 + qi) p = 0.0f;
                            if (DOC && qi >= cut[mt][e >> 1]) p = 0.0f;
                            x[mt][j][e] = p;
                        }
                        pex[(mt * QT + j) * 32] =
                            make_float4(x[mt][j][0], x[mt][j][1], x[mt][j][2], x[mt][j][3]);
                    }
            }
        }
        /* Pᵀ handed over within the pair (the next step's barrier keeps the P warp from
         * overwriting it before its partner has read it) */
        if (ds_role) bar_sync(1 + kw, 64);
        else bar_arrive(1 + kw, 64);
        if (active) {
            /* the step's dS tile: head, query tile q0 / KV_BQ, key tile kt */
            const size_t tile =
                (size_t)(kvh * group + step / nqt) * ds_head + ds_tile_base(q0 / KV_BQ);
            bf16 *const ds_out = ds_lane + tile * DS_TILE;
            if (ds_role) {
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int j = 0; j < QT; j++) {
                        const float4 p = pex[(mt * QT + j) * 32];
                        const float pv[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int qi = 8 * j + 2 * t + (e & 1);
                            x[mt][j][e] = pv[e] * (x[mt][j][e] - D_s[qi]) * scale;
                        }
                    }
            }
            /* dV += Pᵀ·dO or dK += dSᵀ·Q: B(k = query, n = dim), stored query-major */
            const bf16 *const tsrc = (ds_role ? Qs : dOs) + toff;
#pragma unroll
            for (int kq = 0; kq < KV_BQ / 16; kq++) {
                uint32_t xa[2][4];
                pack_a_frags(xa, x, kq);
                /* dSᵀ keys 16(2kw + mt).., queries 16kq..: fragment (2kw + mt)·4 + kq */
                if (ds_role) {
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
                        *reinterpret_cast<uint4 *>(ds_out + (mt * 4 + kq) * DS_FRAG) =
                            make_uint4(xa[mt][0], xa[mt][1], xa[mt][2], xa[mt][3]);
                }
                mma_regs_kmajor(acc, xa, tsrc + kq * 16 * SS);
            }
        }
    }

    __syncthreads(); /* every warp is done reading K and V: they stage dK and dV */
    const float one[2][2] = {{1.0f, 1.0f}, {1.0f, 1.0f}};
    stage_acc<HDP>(ds_role ? Ks : Vs, acc, one, kw * 32, lane);
    __syncthreads();
    bf16 *const rows = dqkv + ((size_t)b * T + k0) * C3;
    store_tile<KV_BK, HDP, KV_THREADS>(rows + (size_t)(nh + kvh) * hd, C3, Ks, nk, hd, ovec);
    store_tile<KV_BK, HDP, KV_THREADS>(rows + (size_t)(nh + nkv + kvh) * hd, C3, Vs, nk, hd, ovec);
}

constexpr int DQ_THREADS = 128; /* 4 warps */
constexpr int DQ_BR = 128;      /* queries per block: 32 per warp, two dS query tiles */
constexpr int DQ_BC = 64;       /* keys per step: half a dS tile */
constexpr int DQ_STAGES = 2;    /* step buffers (3 stages, 2 blocks per SM: 9 us slower) */
static_assert(DQ_BR == 2 * KV_BQ && KV_BK == 2 * DQ_BC, "a dQ block reads whole dS tiles");
static_assert(DQ_STAGES * DQ_BC >= DQ_BR, "the K buffers stage dQ");

/* dQ = dS·K. Block (head, query tile of 128, batch element b0 + z): over key steps 0, 1,
 * ... up to the diagonal (a fixed order: deterministic), copies the K rows and the dS
 * fragments of both its 64-query tiles, DQ_STAGES-buffered, and accumulates in
 * registers. Only the products remain (a dS fragment is all a warp needs of its rows),
 * so this kernel is short; dS comes from HBM once. Fragments whose keys all follow the
 * warp's rows are skipped: the dK/dV kernel did not write them. DOC: key steps start at
 * the first 128-key tile of the block's first dS tile (attention_doc.cuh), and the warps
 * of the second skip those before its own: the dK/dV kernel wrote neither. */
template <int HDP, bool DOC>
__global__ void __launch_bounds__(DQ_THREADS, 3)
    attn_bwd_dq_kernel(bf16 *dqkv, const bf16 *dS, size_t ds_head, const bf16 *qkv, int b0,
                       int T, int nh, int nkv, int hd, bool vec, bool ovec, const int32_t *doc) {
    constexpr int SS = HDP + 8, DT = HDP / 8, HALF = DS_TILE / 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *const Kb = reinterpret_cast<bf16 *>(smem_raw); /* [DQ_STAGES][DQ_BC][SS], then dQ */
    bf16 *const Sb = Kb + DQ_STAGES * DQ_BC * SS;         /* [DQ_STAGES][2][HALF] */

    const int h = blockIdx.x, qt = gridDim.y - 1 - blockIdx.y, b = b0 + blockIdx.z;
    const int kvh = h / (nh / nkv);
    const int q0 = qt * DQ_BR;
    const size_t C3 = (size_t)(nh + 2 * nkv) * hd;
    const bf16 *const kbase = qkv + (size_t)b * T * C3 + (size_t)(nh + kvh) * hd;
    const bf16 *const dsh = dS + ((size_t)blockIdx.z * nh + h) * ds_head * DS_TILE;
    const int nq64 = (T + KV_BQ - 1) / KV_BQ;
    /* key steps up to the diagonal, none starting past T; DOC: from the first key tile of
     * query tile 2qt (s0), and of query tile 2qt + 1 for the warps of its rows (s1) */
    const int nsteps = min(2 * qt + 2, (T + DQ_BC - 1) / DQ_BC);
    const int s0 = DOC ? 2 * (doc_first_key(doc, b, T, q0) / KV_BK) : 0;
    /* starts step s's copies, if there is a step s, and commits a group either way (so
     * that the wait below counts steps): keys s·DQ_BC.., and the half s % 2 (fragments
     * kk = 4(s % 2)..) of key tile s / 2 of both query tiles */
    auto issue = [&](int s) {
        if (s < nsteps) {
            const int buf = s % DQ_STAGES, k1 = s * DQ_BC;
            load_tile<DQ_BC, HDP, DQ_THREADS>(Kb + buf * DQ_BC * SS, kbase + (size_t)k1 * C3, C3,
                                              min(DQ_BC, T - k1), hd, vec);
#pragma unroll
            for (int qh = 0; qh < 2; qh++) {
                const int Q = 2 * qt + qh;
                if (Q >= nq64) break;
                const bf16 *const src =
                    dsh + (ds_tile_base(Q) + (s >> 1)) * DS_TILE + (s & 1) * HALF;
                bf16 *const dst = Sb + (2 * buf + qh) * HALF;
#pragma unroll 4
                for (int i = threadIdx.x; i < HALF / 8; i += DQ_THREADS)
                    cp_async16(dst + 8 * i, src + 8 * i, true);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < DQ_STAGES - 1; s++) issue(s0 + s);

    float dq[2][DT][4];
    zero_frags(dq);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wq0 = q0 + warp * 32;
    const int toff = t_off<SS>(lane);
    /* the warp's rows: query tile warp / 2, m-tiles qm = 2(warp % 2) + mt */
    const int foff = (warp >> 1) * HALF + (warp & 1) * 2 * DS_FRAG + lane * 8;
    const int s1 = DOC && q0 + KV_BQ < T ? 2 * (doc_first_key(doc, b, T, q0 + KV_BQ) / KV_BK) : 0;

    for (int s = s0; s < nsteps; s++) {
        const int buf = s % DQ_STAGES;
        cp_async_wait<DQ_STAGES - 2>(); /* step s's group is complete */
        __syncthreads(); /* ...visible to all; everyone is done with step s-1's buffer */
        issue(s + DQ_STAGES - 1);       /* into step s-1's buffer */
        if (wq0 >= T) continue;         /* no rows (and perhaps no dS tile) */
        /* DOC: no dS tile before the rows' first key tile */
        if (DOC && (warp >> 1) && s < s1) continue;
        const int k1 = s * DQ_BC;
        const bf16 *const Ks = Kb + buf * DQ_BC * SS;
        const bf16 *const Sf = Sb + 2 * buf * HALF + foff;
#pragma unroll
        for (int kk = 0; kk < DQ_BC / 16; kk++) {
            if (k1 + 16 * kk > wq0 + 31) break; /* keys after every row of the warp */
            uint32_t sa[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                /* the quarters (keys 0-7 | 8-15) × (queries 0-7 | 8-15) of dSᵀ, in
                 * registers 0, 1, 2, 3 (an A fragment of dSᵀ); transposed, they are A
                 * registers 0, 2, 1, 3 of dS */
                const uint4 v = *reinterpret_cast<const uint4 *>(Sf + (kk * 4 + mt) * DS_FRAG);
                sa[mt][0] = movm_trans(v.x);
                sa[mt][1] = movm_trans(v.z);
                sa[mt][2] = movm_trans(v.y);
                sa[mt][3] = movm_trans(v.w);
            }
            /* B(k = key, n = dim) = K[key][dim], key-major, so ldmatrix.trans */
            mma_regs_kmajor(dq, sa, Ks + kk * 16 * SS + toff);
        }
    }

    cp_async_wait<0>(); /* (only empty groups can remain) */
    __syncthreads();    /* every warp is done with the tiles: Kb (DQ_BR rows) stages dQ */
    const float one[2][2] = {{1.0f, 1.0f}, {1.0f, 1.0f}};
    stage_acc<HDP>(Kb, dq, one, warp * 32, lane);
    __syncthreads();
    store_tile<DQ_BR, HDP, DQ_THREADS>(dqkv + ((size_t)b * T + q0) * C3 + (size_t)h * hd, C3, Kb,
                                       min(DQ_BR, T - q0), hd, ovec);
}

/* ------------------------------------------------------------------ launchers */

/* Above 48 KiB of dynamic shared memory a kernel must opt in, once. */
template <typename K>
void allow_smem(K kernel, size_t bytes, bool *done) {
    if (*done) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)bytes));
    *done = true;
}

struct attn_args {
    int B, T, nh, nkv, hd;
    float scale, scale_log2;
    bool vec, vec_do, ovec;
    const int32_t *doc; /* doc_start, or NULL */
};

template <int HDP, bool DOC>
void fwd_launch(bf16 *out, float *lse, const bf16 *qkv, const attn_args &a) {
    static bool done = false;
    const size_t smem = (size_t)(FWD_BR + 4 * FWD_BC) * (HDP + 8) * sizeof(bf16); /* Q; K, V twice */
    allow_smem(attn_fwd_kernel<HDP, DOC>, smem, &done);
    dim3 grid(a.nh, (a.T + FWD_BR - 1) / FWD_BR, a.B);
    attn_fwd_kernel<HDP, DOC><<<grid, FWD_THREADS, smem, shlm_cuda_stream()>>>(
        out, lse, qkv, a.T, a.nh, a.nkv, a.hd, a.scale_log2, a.vec, a.ovec, a.doc);
    CUDA_CHECK_LAST();
}

/* The backward's passes: per pass, the dK/dV and dQ kernels of attention_bwd_sm90.cu when
 * sm90 is set and they accept the pass, else this file's (the fallback; both write the same
 * scratch layout, so either dQ kernel follows either dK/dV kernel). rope non-NULL: dq, dk
 * w.r.t. the pre-RoPE q, k; the wgmma kernels rotate in their epilogues (rope_tab: rope.cu's
 * table of T positions), and a pass whose dK/dV or dQ ran here gets rope.cu's inverse
 * kernel on that part (k or q heads) of its rows, after both of its kernels (neither reads
 * dqkv). Returns the SHLM_ATTN_RAN_ bits of the parts that ran on wgmma in every pass. */
template <int HDP, bool DOC>
unsigned bwd_launch(bf16 *dqkv, bf16 *dS, size_t ds_head, int bc, const bf16 *dout,
                    const bf16 *qkv, const float *lse, const float *Dv, const attn_args &a,
                    bool sm90, const shlm_rope *rope, const void *rope_tab) {
    unsigned ran = sm90 ? SHLM_ATTN_RAN_SM90_DKV | SHLM_ATTN_RAN_SM90_DQ : 0u;
    cudaStream_t s = shlm_cuda_stream();
    static bool done_kv = false, done_q = false;
    const size_t smem_kv = (size_t)(2 * KV_BK + 4 * KV_BQ) * (HDP + 8) * sizeof(bf16) +
                           (size_t)KV_NS * 2 * (KV_BQ / 8) * 32 * sizeof(float4) +
                           (DOC ? 6 : 4) * KV_BQ * sizeof(float); /* K, V; Q, dO twice; Pᵀ;
                                                                     lse, D (, lo) twice */
    allow_smem(attn_bwd_dkv_kernel<HDP, DOC>, smem_kv, &done_kv);
    const size_t smem_q = (size_t)DQ_STAGES * (DQ_BC * (HDP + 8) + DS_TILE) * sizeof(bf16);
    /* per stage: K rows and the halves of two dS tiles */
    allow_smem(attn_bwd_dq_kernel<HDP, DOC>, smem_q, &done_q);
    /* bc batch elements per pass: their dS fits the scratch */
    for (int b0 = 0; b0 < a.B; b0 += bc) {
        const int nb = min(bc, a.B - b0);
        const int kv_rc = !sm90 ? 1
                                : shlm_cuda_attention_bwd_dkv_sm90(dqkv, dS, ds_head, dout, qkv, lse,
                                                                   Dv, a.doc, b0, nb, a.T, a.nh, a.nkv,
                                                                   a.hd, a.scale, a.scale_log2,
                                                                   rope_tab);
        if (kv_rc != 0) {
            ran &= ~SHLM_ATTN_RAN_SM90_DKV;
            dim3 grid_kv(a.nkv, (a.T + KV_BK - 1) / KV_BK, nb);
            attn_bwd_dkv_kernel<HDP, DOC><<<grid_kv, KV_THREADS, smem_kv, s>>>(
                dqkv, dS, ds_head, dout, qkv, lse, Dv, b0, a.T, a.nh, a.nkv, a.hd, a.scale,
                a.scale_log2, a.vec, a.vec_do, a.ovec, a.doc);
            CUDA_CHECK_LAST();
        }
        const int dq_rc = !sm90 ? 1
                                : shlm_cuda_attention_bwd_dq_sm90(dqkv, dS, ds_head, qkv, a.doc, b0,
                                                                  nb, a.T, a.nh, a.nkv, a.hd,
                                                                  rope_tab);
        if (dq_rc != 0) {
            ran &= ~SHLM_ATTN_RAN_SM90_DQ;
            dim3 grid_q(a.nh, (a.T + DQ_BR - 1) / DQ_BR, nb);
            attn_bwd_dq_kernel<HDP, DOC><<<grid_q, DQ_THREADS, smem_q, s>>>(
                dqkv, dS, ds_head, qkv, b0, a.T, a.nh, a.nkv, a.hd, a.vec, a.ovec, a.doc);
            CUDA_CHECK_LAST();
        }
        if (rope && (kv_rc != 0 || dq_rc != 0)) {
            /* this pass's rows b0·T.., the q heads first in each row, then the k heads:
             * both, or the one part whose kernel did not rotate */
            const size_t C3 = (size_t)(a.nh + 2 * a.nkv) * a.hd;
            bf16 *const rows = dqkv + (size_t)b0 * a.T * C3;
            const int first = dq_rc != 0 ? 0 : a.nh;
            const int heads = (dq_rc != 0 ? a.nh : 0) + (kv_rc != 0 ? a.nkv : 0);
            shlm_cuda_rope(rows + (size_t)first * a.hd, nb * a.T, a.T, (int)C3, heads, rope,
                           NULL, 1);
        }
    }
    return ran;
}

attn_args make_args(const char *what, int B, int T, int nh, int nkv, int hd) {
    if (nh <= 0 || nkv <= 0 || nh % nkv != 0 || hd <= 0)
        SHLM_FATAL("%s: need n_heads %% n_kv_heads == 0 and positive sizes (nh=%d nkv=%d hd=%d)",
                   what, nh, nkv, hd);
    if (hd > 128) SHLM_FATAL("%s: head_dim %d > 128 is not supported by the cuda kernels", what, hd);
    if ((T + FWD_BR - 1) / FWD_BR > 65535)
        SHLM_FATAL("%s: sequence length %d is too long for the cuda kernels", what, T);
    attn_args a;
    a.B = B;
    a.T = T;
    a.nh = nh;
    a.nkv = nkv;
    a.hd = hd;
    a.scale = (float)(1.0 / sqrt((double)hd));
    a.scale_log2 = a.scale * LOG2E;
    a.vec = a.vec_do = a.ovec = false;
    a.doc = NULL;
    return a;
}

/* Whether the Hopper wgmma kernels (attention_sm90.cu, attention_bwd_sm90.cu) are tried
 * first: yes unless shlm_cuda_attention_set_sm90 said otherwise (the backend's init does,
 * from cuda.attention). */
int sm90_state = 1;
bool sm90_enabled() { return sm90_state == 1; }

/* the SHLM_ATTN_RAN_ bits of the last forward and the last backward */
unsigned ran_fwd = 0, ran_bwd = 0;

template <bool DOC>
void fwd_dispatch(bf16 *o, float *lse, const bf16 *x, const attn_args &a) {
    if (a.hd <= 16) fwd_launch<16, DOC>(o, lse, x, a);
    else if (a.hd <= 32) fwd_launch<32, DOC>(o, lse, x, a);
    else if (a.hd <= 64) fwd_launch<64, DOC>(o, lse, x, a);
    else fwd_launch<128, DOC>(o, lse, x, a);
}

template <bool DOC>
unsigned bwd_dispatch(bf16 *d, bf16 *dS, size_t ds_head, int bc, const bf16 *g, const bf16 *x,
                      const float *lse, const float *Dv, const attn_args &a, bool sm90,
                      const shlm_rope *th, const void *rt) {
    if (a.hd <= 16) return bwd_launch<16, DOC>(d, dS, ds_head, bc, g, x, lse, Dv, a, sm90, th, rt);
    if (a.hd <= 32) return bwd_launch<32, DOC>(d, dS, ds_head, bc, g, x, lse, Dv, a, sm90, th, rt);
    if (a.hd <= 64) return bwd_launch<64, DOC>(d, dS, ds_head, bc, g, x, lse, Dv, a, sm90, th, rt);
    return bwd_launch<128, DOC>(d, dS, ds_head, bc, g, x, lse, Dv, a, sm90, th, rt);
}

} // namespace

extern "C" void shlm_cuda_attention_fwd(void *out, float *lse, const void *qkv,
                                        const int32_t *doc_start, int B, int T, int nh, int nkv,
                                        int hd) {
    if (B <= 0 || T <= 0) return;
    /* the wgmma kernel of attention_sm90.cu where it applies, unless cuda.attention = mma_sync:
     * 1.29x this file's kernel at 7B shapes on an H200 */
    ran_fwd = 0;
    if (sm90_enabled() &&
        shlm_cuda_attention_fwd_sm90(out, lse, qkv, doc_start, B, T, nh, nkv, hd) == 0) {
        ran_fwd = SHLM_ATTN_RAN_SM90_FWD;
        return;
    }
    attn_args a = make_args("attention_fwd", B, T, nh, nkv, hd);
    a.vec = hd % 8 == 0 && shlm_aligned(qkv, 16);
    a.ovec = hd % 8 == 0 && shlm_aligned(out, 16);
    a.doc = doc_start;
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)qkv;
    if (doc_start) fwd_dispatch<true>(o, lse, x, a);
    else fwd_dispatch<false>(o, lse, x, a);
}

/* The backward's one scratch: D (B·nh·T fp32), then the dS tiles of bc batch elements:
 * per element nh · ds_tile_base(⌈T/64⌉) tiles of 16 KiB, nh·(T² + 128·T) bytes when 128
 * divides T (554 MB at T = 4096, nh = 32). bc: as many as fit DS_PASS_BYTES, but at
 * least enough that the dK/dV grid (kv heads x key tiles x bc) gives every SM four
 * blocks (few kv heads at a short T, as TinyLlama's 4 at 2048, would otherwise leave
 * most SMs idle), up to 2 GiB of dS. */
static void bwd_scratch_layout(int B, int T, int nh, int nkv, size_t *d_bytes, size_t *ds_b,
                               size_t *ds_head, int *bc) {
    *d_bytes = ((size_t)B * nh * T * sizeof(float) + 255) / 256 * 256;
    *ds_head = ds_tile_base((T + KV_BQ - 1) / KV_BQ); /* tiles per head */
    *ds_b = (size_t)nh * *ds_head * DS_TILE * sizeof(bf16);
    const size_t per_b_blocks = (size_t)nkv * ((T + KV_BK - 1) / KV_BK);
    const size_t fill = (4 * (size_t)shlm_cuda_sm_count() + per_b_blocks - 1) / per_b_blocks;
    const size_t cap = ((size_t)2 << 30) / *ds_b;
    size_t want = DS_PASS_BYTES / *ds_b;
    if (want < fill) want = fill < cap ? fill : cap;
    *bc = want < 1 ? 1 : want > (size_t)B ? B : (int)want;
}

extern "C" size_t shlm_cuda_attention_bwd_scratch(int B, int T, int nh, int nkv, int hd) {
    if (B <= 0 || T <= 0 || nh <= 0 || nkv <= 0 || hd <= 0) return 0;
    size_t d_bytes, ds_b, ds_head;
    int bc;
    bwd_scratch_layout(B, T, nh, nkv, &d_bytes, &ds_b, &ds_head, &bc);
    return d_bytes + (size_t)bc * ds_b;
}

extern "C" void shlm_cuda_attention_bwd(void *dqkv, const void *dout, const void *qkv,
                                        const void *out, const float *lse,
                                        const int32_t *doc_start, int B, int T, int nh, int nkv,
                                        int hd, const shlm_rope *rope) {
    ran_bwd = 0;
    if (B <= 0 || T <= 0) return;
    attn_args a = make_args("attention_bwd", B, T, nh, nkv, hd);
    if (rope && rope->head_dim != hd)
        SHLM_FATAL("attention_bwd: rope's head_dim %d is not hd %d", rope->head_dim, hd);
    /* dK/dV and dQ on attention_bwd_sm90.cu's wgmma kernels where they apply */
    const bool sm90 = sm90_enabled();
    /* the table first: building it (once per shape) must not come between the passes */
    const void *rope_tab = rope && sm90 ? shlm_cuda_rope_table(rope, T) : NULL;
    a.vec = hd % 8 == 0 && shlm_aligned(qkv, 16);
    a.vec_do = hd % 8 == 0 && shlm_aligned(dout, 16);
    a.ovec = hd % 8 == 0 && shlm_aligned(dqkv, 16);
    a.doc = doc_start;
    size_t d_bytes, ds_b, ds_head;
    int bc;
    bwd_scratch_layout(B, T, nh, nkv, &d_bytes, &ds_b, &ds_head, &bc);
    unsigned char *scr = (unsigned char *)shlm_cuda_scratch(d_bytes + (size_t)bc * ds_b);
    float *Dv = (float *)scr;
    bf16 *dS = (bf16 *)(scr + d_bytes);
    const bool dvec = hd % 8 == 0 && shlm_aligned(dout, 16) && shlm_aligned(out, 16);
    int lg = 5;
    if (dvec)
        for (lg = 0; (8 << lg) < hd;) lg++;
    const size_t threads = ((size_t)B * T * nh) << lg;
    attn_bwd_d_kernel<<<(unsigned int)((threads + 255) / 256), 256, 0, shlm_cuda_stream()>>>(
        Dv, (const bf16 *)dout, (const bf16 *)out, B, T, nh, hd, lg, dvec);
    CUDA_CHECK_LAST();
    bf16 *d = (bf16 *)dqkv;
    const bf16 *g = (const bf16 *)dout, *x = (const bf16 *)qkv;
    const shlm_rope *th = rope;
    const void *rt = rope_tab;
    ran_bwd = doc_start ? bwd_dispatch<true>(d, dS, ds_head, bc, g, x, lse, Dv, a, sm90, th, rt)
                        : bwd_dispatch<false>(d, dS, ds_head, bc, g, x, lse, Dv, a, sm90, th, rt);
}

extern "C" void shlm_cuda_attention_set_sm90(int enable) { sm90_state = enable ? 1 : 0; }

extern "C" unsigned shlm_cuda_attention_sm90_ran(void) { return ran_fwd | ran_bwd; }
