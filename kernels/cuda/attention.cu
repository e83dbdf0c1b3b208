/* cuda backend causal grouped-query flash attention on tensor cores (mma.sync bf16, fp32
 * accumulation): the T×T scores never exist; the backward recomputes P from the lse. */
#include "kernels/cuda/cuda_common.cuh"

#include <math.h>

/* Shapes (ops.h): qkv (B·T, (nh + 2·nkv)·hd) rows hold [q heads | k heads | v heads];
 * out (B·T, nh·hd); lse (B, nh, T) fp32, natural log; query head h reads kv head
 * h / (nh/nkv).
 *
 * Every kernel is a set of 4 warps; a warp owns 16 rows of a tile and multiplies with
 * mma.m16n8k16 (A 16×16 row-major, B 16×8 column-major, C 16×8 fp32). In the C
 * fragment, lane (g = lane/4, t = lane%4) holds rows g and g+8, columns 2t and 2t+1 of
 * each 8-wide n-tile; the A fragment has the same rows and columns 2t, 2t+1, 2t+8, 2t+9
 * of each 16-wide k-step. So a row of probabilities computed into C fragments is, packed
 * to bf16, already the A fragment of the next product: P never leaves registers.
 *
 * The head dimension is padded with zeros to HDP ∈ {16, 32, 64, 128} (a zero column
 * adds nothing to q·k and produces an output column nobody stores), so any hd ≤ 128
 * works; hd % 8 == 0 (every Llama) takes 16-byte loads, others go element by element.
 * Tiles are staged in shared memory with rows padded by 8 elements (16 bytes): with
 * that stride the 32-bit fragment loads and the ldmatrix row reads hit 32 distinct
 * banks. Tiles stream in through cp.async, double-buffered, so the next tile's copy
 * overlaps the current tile's products (measured: forward 833 -> 721 us, backward 2943 ->
 * 2597 us at B=1, T=4096, 32 heads of 128 on an H200). Scores are kept in the log2
 * domain (scaled by log2 e) so that exp is exp2.
 *
 * Causality: key tiles after a query tile's last row are never visited (no fully
 * masked tile is computed); only tiles that straddle the diagonal apply the mask. */

namespace {

constexpr int ATT_THREADS = 128; /* 4 warps */
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

/* Four 8×8 bf16 matrices, transposed: lanes 8i..8i+7 give the row addresses of matrix i;
 * register i receives matrix i's elements (rows 2t, 2t+1; column g) — exactly a B
 * fragment when the stored rows run along k (keys of V, queries of dO or Q). */
__device__ __forceinline__ void ldsm_x4_trans(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                              uint32_t &r3, const bf16 *p) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ uint32_t lds32(const bf16 *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* lo in the low half = lower index */
    return *reinterpret_cast<uint32_t *>(&v);
}

/* A fragment of 16 rows (r0, r0 + 8) × k-step kk of a shared tile with row stride SS. */
template <int SS>
__device__ __forceinline__ void load_a_frag(uint32_t a[4], const bf16 *s, int r0, int kk, int t) {
    const bf16 *p = s + r0 * SS + kk * 16 + 2 * t;
    a[0] = lds32(p);
    a[1] = lds32(p + 8 * SS);
    a[2] = lds32(p + 8);
    a[3] = lds32(p + 8 * SS + 8);
}

/* 16 bytes global -> shared without passing through registers (Ampere+), so the next
 * tile's copy runs while the current one is multiplied. valid = false copies no source
 * byte and zero-fills the destination. Completion: cp_async_wait, then a barrier. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem);
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* waits until at most N of this thread's most recent groups are still in flight */
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Starts copying ROWS rows × HDP columns from global memory (row stride ld elements) into
 * a shared tile (row stride HDP + 8); rows >= nrows and columns >= hd become zeros. With
 * vec (16-byte aligned rows) the copy is asynchronous and belongs to the caller's next
 * cp_async_commit group; otherwise it is done element by element before returning.
 * Either way the tile may be read only after a barrier that follows the wait. */
template <int ROWS, int HDP>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *g, size_t ld, int nrows, int hd,
                                          bool vec) {
    constexpr int SS = HDP + 8;
    if (vec) {
        constexpr int CH = HDP / 8;
        for (int i = threadIdx.x; i < ROWS * CH; i += ATT_THREADS) {
            const int r = i / CH, c = (i % CH) * 8;
            const bool ok = r < nrows && c < hd;
            cp_async16(s + r * SS + c, ok ? g + (size_t)r * ld + c : g, ok);
        }
    } else {
        for (int i = threadIdx.x; i < ROWS * HDP; i += ATT_THREADS) {
            const int r = i / HDP, c = i % HDP;
            bf16 v = __float2bfloat16_rn(0.0f);
            if (r < nrows && c < hd) v = g[(size_t)r * ld + c];
            s[r * SS + c] = v;
        }
    }
}

/* Stores columns col, col + 1 of a row (col is even), skipping those >= hd. */
__device__ __forceinline__ void store_pair(bf16 *p, float a, float b, int col, int hd, bool pair) {
    if (pair) {
        if (col < hd) *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(a, b);
    } else {
        if (col < hd) p[0] = __float2bfloat16_rn(a);
        if (col + 1 < hd) p[1] = __float2bfloat16_rn(b);
    }
}

/* ------------------------------------------------------------------ forward */

constexpr int FWD_BR = 64; /* queries per block: 16 per warp */
constexpr int FWD_BC = 64; /* keys per step */

/* Block (query tile, head, batch). Online softmax over key tiles 0..(diagonal tile):
 * running max m and sum l per row, O rescaled by exp2(m_old − m_new) as m grows. K/V
 * tiles are double-buffered: tile kt+1 is in flight while tile kt is multiplied.
 * 173 registers a thread (hd 128) allow 2 blocks per SM; capping them at 168 for a third
 * block made ptxas spill and measured 3% slower (H200, T = 4096), so no cap. */
template <int HDP>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_fwd_kernel(bf16 *out, float *lse, const bf16 *qkv, int T, int nh, int nkv, int hd,
                    float scale_log2, bool vec, bool pair) {
    constexpr int SS = HDP + 8, KS = HDP / 16, DT = HDP / 8, NT = FWD_BC / 8;
    static_assert(FWD_BR == FWD_BC, "the diagonal tile logic assumes square tiles");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *const K0 = reinterpret_cast<bf16 *>(smem_raw), *const V0 = K0 + FWD_BC * SS;
    bf16 *const K1 = V0 + FWD_BC * SS, *const V1 = K1 + FWD_BC * SS;

    const int qt = gridDim.x - 1 - blockIdx.x; /* longest (last) query tiles start first */
    const int h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (nh / nkv);
    const int q0 = qt * FWD_BR;
    const size_t C3 = (size_t)(nh + 2 * nkv) * hd, CO = (size_t)nh * hd;
    const bf16 *base = qkv + (size_t)b * T * C3;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = warp * 16 + g; /* the thread's rows in the tile: r0 and r0 + 8 */

    const bf16 *const kbase = base + (size_t)(nh + kvh) * hd;
    const bf16 *const vbase = base + (size_t)(nh + nkv + kvh) * hd;

    /* Q: staged through buffer 1 once, then held as A fragments; tile 0 of K/V goes to
     * buffer 0 meanwhile */
    load_tile<FWD_BR, HDP>(K1, base + (size_t)q0 * C3 + (size_t)h * hd, C3, min(FWD_BR, T - q0),
                           hd, vec);
    cp_async_commit();
    load_tile<FWD_BC, HDP>(K0, kbase, C3, min(FWD_BC, T), hd, vec);
    load_tile<FWD_BC, HDP>(V0, vbase, C3, min(FWD_BC, T), hd, vec);
    cp_async_commit();
    cp_async_wait<1>(); /* Q's group */
    __syncthreads();
    uint32_t qa[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) load_a_frag<SS>(qa[kk], K1, r0, kk, t);
    __syncthreads(); /* every warp holds its Q before buffer 1 is refilled */

    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int qrow[2] = {q0 + r0, q0 + r0 + 8};
    const int kt_end = qt; /* square tiles: the diagonal tile has the same index */

    for (int kt = 0; kt <= kt_end; kt++) {
        const int k0 = kt * FWD_BC;
        const bf16 *const Ks = kt & 1 ? K1 : K0, *const Vs = kt & 1 ? V1 : V0;
        if (kt < kt_end) { /* the next tile into the other buffer, read last iteration */
            const int k1 = k0 + FWD_BC;
            load_tile<FWD_BC, HDP>(kt & 1 ? K0 : K1, kbase + (size_t)k1 * C3, C3,
                                   min(FWD_BC, T - k1), hd, vec);
            load_tile<FWD_BC, HDP>(kt & 1 ? V0 : V1, vbase + (size_t)k1 * C3, C3,
                                   min(FWD_BC, T - k1), hd, vec);
        }
        cp_async_commit(); /* possibly empty: keeps "all but the newest group" = tile kt */
        cp_async_wait<1>();
        __syncthreads();

        /* S = Q·Kᵀ: B(k = dim, n = key) = K[key][dim], two adjacent dims per register */
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const bf16 *kp = Ks + (8 * j + g) * SS + kk * 16 + 2 * t;
                mma_16816(s[j], qa[kk], lds32(kp), lds32(kp + 8));
            }
        }
        const bool diag = kt == kt_end;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[j][e] * scale_log2;
                if (diag && k0 + 8 * j + 2 * t + (e & 1) > qrow[e >> 1]) v = -INFINITY;
                s[j][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        }
        float mref[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            /* every row sees key 0 in tile 0, so mx is finite; guard anyway */
            mref[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
            alpha[r] = exp2f(m[r] - mref[r]);
            m[r] = mx[r];
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[j][e] - mref[e >> 1]);
                s[j][e] = p;
                l[e >> 1] += p; /* this thread's columns; the quad is summed at the end */
            }
        }
#pragma unroll
        for (int d = 0; d < DT; d++) {
            o[d][0] *= alpha[0];
            o[d][1] *= alpha[0];
            o[d][2] *= alpha[1];
            o[d][3] *= alpha[1];
        }
        /* O += P·V: P's C fragments of n-tiles 2kk, 2kk+1 form the A fragment of k-step
         * kk; V's B fragments come from ldmatrix.trans (V is stored key-major) */
#pragma unroll
        for (int kk = 0; kk < FWD_BC / 16; kk++) {
            uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                              pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            const bf16 *vrow = Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SS +
                               (lane >> 4) * 8;
#pragma unroll
            for (int d = 0; d < DT; d += 2) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4_trans(b0, b1, b2, b3, vrow + d * 8);
                mma_16816(o[d], pa, b0, b1);
                mma_16816(o[d + 1], pa, b2, b3);
            }
        }
        __syncthreads(); /* done with this buffer before the next iteration refills it */
    }

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = 1.0f / l[r];
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int q = qrow[r];
        if (q >= T) continue;
        bf16 *orow = out + ((size_t)b * T + q) * CO + (size_t)h * hd;
#pragma unroll
        for (int d = 0; d < DT; d++) {
            const int col = d * 8 + 2 * t;
            store_pair(orow + col, o[d][2 * r] * inv[r], o[d][2 * r + 1] * inv[r], col, hd, pair);
        }
        if (t == 0) lse[((size_t)b * nh + h) * T + q] = (m[r] + log2f(l[r])) * LN2;
    }
}

/* ------------------------------------------------------------------ backward */

/* D[b,h,t] = Σ_d dO·O: the softmax Jacobian's row term. One warp per (row, head). */
__global__ void attn_bwd_d_kernel(float *Dv, const bf16 *dout, const bf16 *out, int B, int T,
                                  int nh, int hd) {
    const size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= (size_t)B * T * nh) return;
    const size_t row = w / nh;
    const int h = (int)(w % nh);
    const bf16 *a = dout + row * nh * hd + (size_t)h * hd, *o = out + row * nh * hd + (size_t)h * hd;
    float s = 0.0f;
    for (int d = lane; d < hd; d += 32) s += __bfloat162float(a[d]) * __bfloat162float(o[d]);
    s = warp_sum(s);
    if (lane == 0) {
        const size_t b = row / T, tt = row % T;
        Dv[(b * nh + h) * T + tt] = s;
    }
}

constexpr int KV_BC = 64; /* keys per block: 16 per warp */
constexpr int KV_BQ = 32; /* queries per step */

/* dK, dV. Block (key tile, kv head, batch) owns those keys' dk/dv rows and visits every
 * query head of the group and every query tile at or after the key tile: it is the only
 * writer of its rows, and sums in a fixed order (deterministic, no atomics). Per step,
 * a warp computes its 16 keys × 32 queries of Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, then
 *   Pᵀ = exp2(Sᵀ·c − lse₂), dSᵀ = Pᵀ ∘ (dPᵀ − D)·scale,
 *   dV += Pᵀ·dO,  dK += dSᵀ·Q.
 * The steps (query head, query tile) run as one sequence whose Q/dO/lse/D tiles are
 * double-buffered: step s+1's copy is in flight while step s is multiplied. */
template <int HDP>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_bwd_dkv_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                        const float *Dv, int T, int nh, int nkv, int hd, float scale,
                        float scale_log2, bool vec, bool vec_do, bool pair) {
    constexpr int SS = HDP + 8, KS = HDP / 16, DT = HDP / 8, QT = KV_BQ / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *const Ks = reinterpret_cast<bf16 *>(smem_raw);
    bf16 *const Vs = Ks + KV_BC * SS;
    bf16 *const Qb = Vs + KV_BC * SS;      /* [2][KV_BQ][SS] */
    bf16 *const dOb = Qb + 2 * KV_BQ * SS; /* [2][KV_BQ][SS] */
    float *const lse_b = reinterpret_cast<float *>(dOb + 2 * KV_BQ * SS); /* [2][KV_BQ] */
    float *const D_b = lse_b + 2 * KV_BQ;                                 /* [2][KV_BQ] */

    const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int k0 = kt * KV_BC;
    const int group = nh / nkv;
    const size_t C3 = (size_t)(nh + 2 * nkv) * hd, CO = (size_t)nh * hd;
    const bf16 *base = qkv + (size_t)b * T * C3;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = warp * 16 + g;
    const int krow[2] = {k0 + r0, k0 + r0 + 8};

    load_tile<KV_BC, HDP>(Ks, base + (size_t)k0 * C3 + (size_t)(nh + kvh) * hd, C3,
                          min(KV_BC, T - k0), hd, vec);
    load_tile<KV_BC, HDP>(Vs, base + (size_t)k0 * C3 + (size_t)(nh + nkv + kvh) * hd, C3,
                          min(KV_BC, T - k0), hd, vec);

    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++) {
        dk[d][0] = dk[d][1] = dk[d][2] = dk[d][3] = 0.0f;
        dv[d][0] = dv[d][1] = dv[d][2] = dv[d][3] = 0.0f;
    }

    /* queries before k0 see none of these keys: tiles from k0 to T, for each head */
    const int nqt = (T - k0 + KV_BQ - 1) / KV_BQ, nsteps = group * nqt;
    /* starts step s's copies into buffer `buf` (lse and D by plain loads) */
    auto issue = [&](int s, int buf) {
        const int h = kvh * group + s / nqt, q0 = k0 + (s % nqt) * KV_BQ;
        const int nq = min(KV_BQ, T - q0);
        load_tile<KV_BQ, HDP>(Qb + buf * KV_BQ * SS, base + (size_t)q0 * C3 + (size_t)h * hd, C3,
                              nq, hd, vec);
        load_tile<KV_BQ, HDP>(dOb + buf * KV_BQ * SS,
                              dout + ((size_t)b * T + q0) * CO + (size_t)h * hd, CO, nq, hd,
                              vec_do);
        if (threadIdx.x < KV_BQ) {
            const int q = q0 + threadIdx.x;
            /* +inf makes every probability of a row past T exactly zero */
            lse_b[buf * KV_BQ + threadIdx.x] =
                q < T ? lse[((size_t)b * nh + h) * T + q] * LOG2E : INFINITY;
            D_b[buf * KV_BQ + threadIdx.x] = q < T ? Dv[((size_t)b * nh + h) * T + q] : 0.0f;
        }
    };
    issue(0, 0);
    cp_async_commit(); /* K, V and step 0 */

    for (int step = 0; step < nsteps; step++) {
        const int cur = step & 1;
        const int q0 = k0 + (step % nqt) * KV_BQ;
        if (step + 1 < nsteps) issue(step + 1, cur ^ 1); /* buffer read last step */
        cp_async_commit();
        cp_async_wait<1>(); /* everything but the newest group: this step's tiles */
        __syncthreads();
        {
            const bf16 *const Qs = Qb + cur * KV_BQ * SS, *const dOs = dOb + cur * KV_BQ * SS;
            const float *const lse_s = lse_b + cur * KV_BQ, *const D_s = D_b + cur * KV_BQ;

            float st[QT][4], dpt[QT][4];
#pragma unroll
            for (int j = 0; j < QT; j++) {
                st[j][0] = st[j][1] = st[j][2] = st[j][3] = 0.0f;
                dpt[j][0] = dpt[j][1] = dpt[j][2] = dpt[j][3] = 0.0f;
            }
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                uint32_t ka[4], va[4];
                load_a_frag<SS>(ka, Ks, r0, kk, t);
                load_a_frag<SS>(va, Vs, r0, kk, t);
#pragma unroll
                for (int j = 0; j < QT; j++) {
                    const bf16 *qp = Qs + (8 * j + g) * SS + kk * 16 + 2 * t;
                    const bf16 *op = dOs + (8 * j + g) * SS + kk * 16 + 2 * t;
                    mma_16816(st[j], ka, lds32(qp), lds32(qp + 8));
                    mma_16816(dpt[j], va, lds32(op), lds32(op + 8));
                }
            }
#pragma unroll
            for (int j = 0; j < QT; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = 8 * j + 2 * t + (e & 1);
                    const int q = q0 + qi, key = krow[e >> 1];
                    const float p = key <= q ? exp2f(st[j][e] * scale_log2 - lse_s[qi]) : 0.0f;
                    dpt[j][e] = p * (dpt[j][e] - D_s[qi]) * scale;
                    st[j][e] = p;
                }
            }
#pragma unroll
            for (int kq = 0; kq < KV_BQ / 16; kq++) {
                uint32_t pa[4] = {pack_bf16(st[2 * kq][0], st[2 * kq][1]),
                                  pack_bf16(st[2 * kq][2], st[2 * kq][3]),
                                  pack_bf16(st[2 * kq + 1][0], st[2 * kq + 1][1]),
                                  pack_bf16(st[2 * kq + 1][2], st[2 * kq + 1][3])};
                uint32_t da[4] = {pack_bf16(dpt[2 * kq][0], dpt[2 * kq][1]),
                                  pack_bf16(dpt[2 * kq][2], dpt[2 * kq][3]),
                                  pack_bf16(dpt[2 * kq + 1][0], dpt[2 * kq + 1][1]),
                                  pack_bf16(dpt[2 * kq + 1][2], dpt[2 * kq + 1][3])};
                const int roff = (kq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SS + (lane >> 4) * 8;
#pragma unroll
                for (int d = 0; d < DT; d += 2) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4_trans(b0, b1, b2, b3, dOs + roff + d * 8);
                    mma_16816(dv[d], pa, b0, b1);
                    mma_16816(dv[d + 1], pa, b2, b3);
                    ldsm_x4_trans(b0, b1, b2, b3, Qs + roff + d * 8);
                    mma_16816(dk[d], da, b0, b1);
                    mma_16816(dk[d + 1], da, b2, b3);
                }
            }
        }
        __syncthreads(); /* done with buffer cur before the next step refills it */
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = krow[r];
        if (key >= T) continue;
        bf16 *row = dqkv + ((size_t)b * T + key) * C3;
        bf16 *dkrow = row + (size_t)(nh + kvh) * hd, *dvrow = row + (size_t)(nh + nkv + kvh) * hd;
#pragma unroll
        for (int d = 0; d < DT; d++) {
            const int col = d * 8 + 2 * t;
            store_pair(dkrow + col, dk[d][2 * r], dk[d][2 * r + 1], col, hd, pair);
            store_pair(dvrow + col, dv[d][2 * r], dv[d][2 * r + 1], col, hd, pair);
        }
    }
}

constexpr int DQ_BR = 64; /* queries per block: 16 per warp */
constexpr int DQ_BC = 32; /* keys per step */

/* dQ. Block (query tile, head, batch) recomputes S and dP for its rows over the key
 * tiles up to the diagonal and accumulates dQ = dS·K in registers: a second pass over
 * QKᵀ and dO·Vᵀ instead of float atomics into dQ, which keeps the backward
 * deterministic (7 products instead of 5). */
template <int HDP>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_bwd_dq_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                       const float *Dv, int T, int nh, int nkv, int hd, float scale,
                       float scale_log2, bool vec, bool vec_do, bool pair) {
    constexpr int SS = HDP + 8, KS = HDP / 16, DT = HDP / 8, NT = DQ_BC / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *const Qst = reinterpret_cast<bf16 *>(smem_raw); /* Q, staged once */
    bf16 *const dOst = Qst + DQ_BR * SS;                  /* dO, staged once */
    bf16 *const K0 = dOst + DQ_BR * SS, *const V0 = K0 + DQ_BC * SS; /* K/V, double-buffered */
    bf16 *const K1 = V0 + DQ_BC * SS, *const V1 = K1 + DQ_BC * SS;

    const int qt = gridDim.x - 1 - blockIdx.x; /* longest first */
    const int h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (nh / nkv);
    const int q0 = qt * DQ_BR;
    const size_t C3 = (size_t)(nh + 2 * nkv) * hd, CO = (size_t)nh * hd;
    const bf16 *base = qkv + (size_t)b * T * C3;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = warp * 16 + g;
    const int qrow[2] = {q0 + r0, q0 + r0 + 8};

    const bf16 *const kbase = base + (size_t)(nh + kvh) * hd;
    const bf16 *const vbase = base + (size_t)(nh + nkv + kvh) * hd;
    const int nq = min(DQ_BR, T - q0);
    load_tile<DQ_BR, HDP>(Qst, base + (size_t)q0 * C3 + (size_t)h * hd, C3, nq, hd, vec);
    load_tile<DQ_BR, HDP>(dOst, dout + ((size_t)b * T + q0) * CO + (size_t)h * hd, CO, nq, hd,
                          vec_do);
    cp_async_commit();
    load_tile<DQ_BC, HDP>(K0, kbase, C3, min(DQ_BC, T), hd, vec); /* key tile 0 meanwhile */
    load_tile<DQ_BC, HDP>(V0, vbase, C3, min(DQ_BC, T), hd, vec);
    cp_async_commit();
    cp_async_wait<1>(); /* Q and dO */
    __syncthreads();
    uint32_t qa[KS][4], da[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        load_a_frag<SS>(qa[kk], Qst, r0, kk, t);
        load_a_frag<SS>(da[kk], dOst, r0, kk, t);
    }
    float lse2[2], Drow[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int q = qrow[r];
        lse2[r] = q < T ? lse[((size_t)b * nh + h) * T + q] * LOG2E : INFINITY;
        Drow[r] = q < T ? Dv[((size_t)b * nh + h) * T + q] : 0.0f;
    }

    float dq[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;

    const int kt_end = (q0 + DQ_BR - 1) / DQ_BC < (T - 1) / DQ_BC ? (q0 + DQ_BR - 1) / DQ_BC
                                                                  : (T - 1) / DQ_BC;
    for (int kt = 0; kt <= kt_end; kt++) {
        const int k0 = kt * DQ_BC;
        const bf16 *const Ks = kt & 1 ? K1 : K0, *const Vs = kt & 1 ? V1 : V0;
        if (kt < kt_end) { /* the next tile into the other buffer, read last iteration */
            const int k1 = k0 + DQ_BC;
            load_tile<DQ_BC, HDP>(kt & 1 ? K0 : K1, kbase + (size_t)k1 * C3, C3,
                                  min(DQ_BC, T - k1), hd, vec);
            load_tile<DQ_BC, HDP>(kt & 1 ? V0 : V1, vbase + (size_t)k1 * C3, C3,
                                  min(DQ_BC, T - k1), hd, vec);
        }
        cp_async_commit();
        cp_async_wait<1>(); /* tile kt */
        __syncthreads();

        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
        }
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const bf16 *kp = Ks + (8 * j + g) * SS + kk * 16 + 2 * t;
                const bf16 *vp = Vs + (8 * j + g) * SS + kk * 16 + 2 * t;
                mma_16816(s[j], qa[kk], lds32(kp), lds32(kp + 8));
                mma_16816(dp[j], da[kk], lds32(vp), lds32(vp + 8));
            }
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + 8 * j + 2 * t + (e & 1);
                const int r = e >> 1;
                const float p = key <= qrow[r] ? exp2f(s[j][e] * scale_log2 - lse2[r]) : 0.0f;
                s[j][e] = p * (dp[j][e] - Drow[r]) * scale; /* dS */
            }
        }
        /* dQ += dS·K: B(k = key, n = dim) = K[key][dim], key-major, so ldmatrix.trans */
#pragma unroll
        for (int kk = 0; kk < DQ_BC / 16; kk++) {
            uint32_t sa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                              pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            const bf16 *krow = Ks + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SS +
                               (lane >> 4) * 8;
#pragma unroll
            for (int d = 0; d < DT; d += 2) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4_trans(b0, b1, b2, b3, krow + d * 8);
                mma_16816(dq[d], sa, b0, b1);
                mma_16816(dq[d + 1], sa, b2, b3);
            }
        }
        __syncthreads(); /* done with this buffer before the next iteration refills it */
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int q = qrow[r];
        if (q >= T) continue;
        bf16 *row = dqkv + ((size_t)b * T + q) * C3 + (size_t)h * hd;
#pragma unroll
        for (int d = 0; d < DT; d++) {
            const int col = d * 8 + 2 * t;
            store_pair(row + col, dq[d][2 * r], dq[d][2 * r + 1], col, hd, pair);
        }
    }
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
    bool vec, vec_do, pair;
};

template <int HDP>
void fwd_launch(bf16 *out, float *lse, const bf16 *qkv, const attn_args &a) {
    static bool done = false;
    const size_t smem = (size_t)4 * FWD_BC * (HDP + 8) * sizeof(bf16); /* K, V twice */
    allow_smem(attn_fwd_kernel<HDP>, smem, &done);
    dim3 grid((a.T + FWD_BR - 1) / FWD_BR, a.nh, a.B);
    attn_fwd_kernel<HDP><<<grid, ATT_THREADS, smem, shlm_cuda_stream()>>>(
        out, lse, qkv, a.T, a.nh, a.nkv, a.hd, a.scale_log2, a.vec, a.pair);
    CUDA_CHECK_LAST();
}

template <int HDP>
void bwd_launch(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                const float *Dv, const attn_args &a) {
    cudaStream_t s = shlm_cuda_stream();
    static bool done_kv = false, done_q = false;
    const size_t smem_kv = (size_t)(2 * KV_BC + 4 * KV_BQ) * (HDP + 8) * sizeof(bf16) +
                           4 * KV_BQ * sizeof(float); /* K, V; Q, dO, lse, D twice */
    allow_smem(attn_bwd_dkv_kernel<HDP>, smem_kv, &done_kv);
    dim3 grid_kv((a.T + KV_BC - 1) / KV_BC, a.nkv, a.B);
    attn_bwd_dkv_kernel<HDP><<<grid_kv, ATT_THREADS, smem_kv, s>>>(
        dqkv, dout, qkv, lse, Dv, a.T, a.nh, a.nkv, a.hd, a.scale, a.scale_log2, a.vec,
        a.vec_do, a.pair);
    CUDA_CHECK_LAST();
    const size_t smem_q = (size_t)(2 * DQ_BR + 4 * DQ_BC) * (HDP + 8) * sizeof(bf16);
    allow_smem(attn_bwd_dq_kernel<HDP>, smem_q, &done_q);
    dim3 grid_q((a.T + DQ_BR - 1) / DQ_BR, a.nh, a.B);
    attn_bwd_dq_kernel<HDP><<<grid_q, ATT_THREADS, smem_q, s>>>(
        dqkv, dout, qkv, lse, Dv, a.T, a.nh, a.nkv, a.hd, a.scale, a.scale_log2, a.vec,
        a.vec_do, a.pair);
    CUDA_CHECK_LAST();
}

attn_args make_args(const char *what, int B, int T, int nh, int nkv, int hd) {
    if (nh <= 0 || nkv <= 0 || nh % nkv != 0 || hd <= 0)
        SHLM_FATAL("%s: need n_heads %% n_kv_heads == 0 and positive sizes (nh=%d nkv=%d hd=%d)",
                   what, nh, nkv, hd);
    if (hd > 128) SHLM_FATAL("%s: head_dim %d > 128 is not supported by the cuda kernels", what, hd);
    attn_args a;
    a.B = B;
    a.T = T;
    a.nh = nh;
    a.nkv = nkv;
    a.hd = hd;
    a.scale = (float)(1.0 / sqrt((double)hd));
    a.scale_log2 = a.scale * LOG2E;
    a.vec = a.vec_do = a.pair = false;
    return a;
}

} // namespace

extern "C" void shlm_cuda_attention_fwd(void *out, float *lse, const void *qkv, int B, int T,
                                        int nh, int nkv, int hd) {
    if (B <= 0 || T <= 0) return;
    attn_args a = make_args("attention_fwd", B, T, nh, nkv, hd);
    a.vec = hd % 8 == 0 && shlm_aligned(qkv, 16);
    a.pair = hd % 2 == 0 && shlm_aligned(out, 4);
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)qkv;
    if (hd <= 16) fwd_launch<16>(o, lse, x, a);
    else if (hd <= 32) fwd_launch<32>(o, lse, x, a);
    else if (hd <= 64) fwd_launch<64>(o, lse, x, a);
    else fwd_launch<128>(o, lse, x, a);
}

extern "C" void shlm_cuda_attention_bwd(void *dqkv, const void *dout, const void *qkv,
                                        const void *out, const float *lse, int B, int T, int nh,
                                        int nkv, int hd) {
    if (B <= 0 || T <= 0) return;
    attn_args a = make_args("attention_bwd", B, T, nh, nkv, hd);
    a.vec = hd % 8 == 0 && shlm_aligned(qkv, 16);
    a.vec_do = hd % 8 == 0 && shlm_aligned(dout, 16);
    a.pair = hd % 2 == 0 && shlm_aligned(dqkv, 4);
    float *Dv = (float *)shlm_cuda_scratch((size_t)B * nh * T * sizeof(float));
    const size_t warps = (size_t)B * T * nh;
    attn_bwd_d_kernel<<<(unsigned int)((warps * 32 + 255) / 256), 256, 0, shlm_cuda_stream()>>>(
        Dv, (const bf16 *)dout, (const bf16 *)out, B, T, nh, hd);
    CUDA_CHECK_LAST();
    bf16 *d = (bf16 *)dqkv;
    const bf16 *g = (const bf16 *)dout, *x = (const bf16 *)qkv;
    if (hd <= 16) bwd_launch<16>(d, g, x, lse, Dv, a);
    else if (hd <= 32) bwd_launch<32>(d, g, x, lse, Dv, a);
    else if (hd <= 64) bwd_launch<64>(d, g, x, lse, Dv, a);
    else bwd_launch<128>(d, g, x, lse, Dv, a);
}
