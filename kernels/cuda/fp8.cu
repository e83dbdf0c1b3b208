/* cuda backend FP8 matmul (kernels/ops.h, "FP8"): whether the bound device runs it, the
 * dynamic quantization of bf16 matrices to e4m3/e5m2 codes with tensorwise or rowwise
 * scales (optionally transposed), FP8 weights cast from fp32 parameters, the transpose of
 * codes, and the scaled TN product through cuBLASLt. */
#include "kernels/cuda/cuda_common.cuh"

#include <cuda_fp8.h>
#include <string.h>

/* ------------------------------------------------------------------ the scaling rule */

/* ops.h's rule, the one copy every kernel below uses: scale = fmax / max(amax, 1e-12f),
 * codes = satfinite RNE fp8(x · scale), scale_inv = 1 / scale. The _rn intrinsics are
 * IEEE division, reciprocal and product whatever the nvcc flags (fast math included), so
 * the bits match the cpu backend's plain C arithmetic. */
template <int F> struct fp8_format;
template <> struct fp8_format<SHLM_FP8_E4M3> {
    static constexpr float max = 448.0f;
    static constexpr __nv_fp8_interpretation_t interp = __NV_E4M3;
};
template <> struct fp8_format<SHLM_FP8_E5M2> {
    static constexpr float max = 57344.0f;
    static constexpr __nv_fp8_interpretation_t interp = __NV_E5M2;
};

template <int F> __device__ __forceinline__ float fp8_scale_of(float amax) {
    return __fdiv_rn(fp8_format<F>::max, fmaxf(amax, 1e-12f));
}

/* two codes in one 16-bit word, x's in the low byte (cvt.rn.satfinite.e4m3x2/e5m2x2:
 * round to nearest even, beyond the largest (±inf too) to ±largest, NaN to NaN) */
template <int F> __device__ __forceinline__ uint32_t fp8x2(float x, float y, float scale) {
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(x, scale), __fmul_rn(y, scale)),
                                              __NV_SATFINITE, fp8_format<F>::interp);
}
template <int F> __device__ __forceinline__ uint8_t fp8x1(float x, float scale) {
    return (uint8_t)__nv_cvt_float_to_fp8(__fmul_rn(x, scale), __NV_SATFINITE, fp8_format<F>::interp);
}


/* ------------------------------------------------------------------ kernels */

enum { Q_THREADS = 256 };

/* *amax_bits = max(*amax_bits, max |x[i]|) over n bf16 (grid-stride; 16-byte loads, two
 * in flight per thread, when vec). */
__global__ void __launch_bounds__(Q_THREADS) amax_kernel(unsigned *amax_bits, const bf16 *x,
                                                         size_t n, bool vec) {
    __shared__ float red[32];
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    float m = 0.0f;
    size_t done = 0;
    if (vec) {
        const size_t nv = n / 8;
        for (size_t v = i; v < nv; v += 2 * stride) {
            float f[8], g[8];
            load_bf16x8(f, x + v * 8);
            const bool two = v + stride < nv;
            if (two) load_bf16x8(g, x + (v + stride) * 8);
#pragma unroll
            for (int k = 0; k < 8; k++) m = fmaxf(m, fabsf(f[k]));
            if (two) {
#pragma unroll
                for (int k = 0; k < 8; k++) m = fmaxf(m, fabsf(g[k]));
            }
        }
        done = nv * 8;
    }
    for (size_t k = done + i; k < n; k += stride) m = fmaxf(m, fabsf(__bfloat162float(x[k])));
    m = block_max(m, red);
    if (threadIdx.x == 0) amax_merge(amax_bits, m);
}

/* amax_bits[c] = max(amax_bits[c], max over rows |x[r, c]|) for x (R, C): a block covers
 * 256 columns (32 lanes of 8) and `rows_per_block` rows (8 warps striding over them). */
enum { COLMAX_ROWS = 128 };
__global__ void __launch_bounds__(Q_THREADS) colmax_kernel(unsigned *amax_bits, const bf16 *x,
                                                           int R, int C, bool vec) {
    __shared__ float red[Q_THREADS / 32][32 * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c0 = (blockIdx.x * 32 + lane) * 8;
    const bool full = vec && c0 + 8 <= C;
    float m[8];
#pragma unroll
    for (int j = 0; j < 8; j++) m[j] = 0.0f;
    const int nty = (R + COLMAX_ROWS - 1) / COLMAX_ROWS;
    for (int t = blockIdx.y; t < nty; t += gridDim.y) {
        const int r_end = min(R, (t + 1) * COLMAX_ROWS);
        for (int r = t * COLMAX_ROWS + warp; r < r_end; r += Q_THREADS / 32) {
            const bf16 *p = x + (size_t)r * C + c0;
            if (full) {
                float f[8];
                load_bf16x8(f, p);
#pragma unroll
                for (int j = 0; j < 8; j++) m[j] = fmaxf(m[j], fabsf(f[j]));
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (c0 + j < C) m[j] = fmaxf(m[j], fabsf(__bfloat162float(p[j])));
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 8; j++) red[warp][lane * 8 + j] = m[j];
    __syncthreads();
    /* thread t merges column t of the block over the warps */
    float v = 0.0f;
    for (int w = 0; w < Q_THREADS / 32; w++) v = fmaxf(v, red[w][threadIdx.x]);
    const int c = blockIdx.x * 256 + threadIdx.x;
    if (c < C) amax_merge(&amax_bits[c], v);
}

/* codes[i] = fp8(x[i] · scale(amax)) over n (tensorwise, not transposed). 16 elements per
 * step when vec (two 16-byte loads, one 16-byte store). The steps run last to first: the
 * amax pass read x first to last, so its end is what L2 still holds. */
template <int F>
__global__ void __launch_bounds__(Q_THREADS) cast_kernel(uint8_t *codes, const bf16 *x, size_t n,
                                                         const unsigned *amax_bits, bool vec) {
    const float scale = fp8_scale_of<F>(__uint_as_float(*amax_bits));
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (vec) {
        const size_t nv = n / 16;
        for (size_t j = i; j < nv; j += stride) {
            const size_t v = nv - 1 - j;
            float f[8], g[8];
            load_bf16x8(f, x + v * 16);
            load_bf16x8(g, x + v * 16 + 8);
            uint4 o;
            o.x = fp8x2<F>(f[0], f[1], scale) | fp8x2<F>(f[2], f[3], scale) << 16;
            o.y = fp8x2<F>(f[4], f[5], scale) | fp8x2<F>(f[6], f[7], scale) << 16;
            o.z = fp8x2<F>(g[0], g[1], scale) | fp8x2<F>(g[2], g[3], scale) << 16;
            o.w = fp8x2<F>(g[4], g[5], scale) | fp8x2<F>(g[6], g[7], scale) << 16;
            reinterpret_cast<uint4 *>(codes)[v] = o;
        }
        done = nv * 16;
    }
    for (size_t k = done + i; k < n; k += stride) codes[k] = fp8x1<F>(__bfloat162float(x[k]), scale);
}

/* Rowwise, not transposed: block r reads row r of x (rows, cols) twice, for its amax and
 * then (from L1/L2) for the cast, and writes scale_inv[r]. vec: 16-byte loads and 8-byte
 * stores (cols a multiple of 8, aligned pointers). */
template <int F>
__global__ void __launch_bounds__(Q_THREADS) rowwise_kernel(uint8_t *codes, float *scale_inv,
                                                            const bf16 *x, int cols, bool vec) {
    __shared__ float red[32];
    const bf16 *xr = x + (size_t)blockIdx.x * cols;
    uint8_t *cr = codes + (size_t)blockIdx.x * cols;
    float m = 0.0f;
    if (vec) {
        for (int c = threadIdx.x * 8; c < cols; c += Q_THREADS * 8) {
            float f[8];
            load_bf16x8(f, xr + c);
#pragma unroll
            for (int k = 0; k < 8; k++) m = fmaxf(m, fabsf(f[k]));
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += Q_THREADS) m = fmaxf(m, fabsf(__bfloat162float(xr[c])));
    }
    m = block_max(m, red);
    const float scale = fp8_scale_of<F>(m);
    if (vec) {
        for (int c = threadIdx.x * 8; c < cols; c += Q_THREADS * 8) {
            float f[8];
            load_bf16x8(f, xr + c);
            uint2 o;
            o.x = fp8x2<F>(f[0], f[1], scale) | fp8x2<F>(f[2], f[3], scale) << 16;
            o.y = fp8x2<F>(f[4], f[5], scale) | fp8x2<F>(f[6], f[7], scale) << 16;
            *reinterpret_cast<uint2 *>(cr + c) = o;
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += Q_THREADS) cr[c] = fp8x1<F>(__bfloat162float(xr[c]), scale);
    }
    if (threadIdx.x == 0) scale_inv[blockIdx.x] = __frcp_rn(scale);
}

/* Transpose-cast: x (R, C) bf16 -> codes (C, R), codes[c·R + r] = fp8(x[r, c] · scale of c)
 * (ROWWISE: amax_bits[c]; else amax_bits[0]). A block takes a tile of TT_ROWS = 16·RPT
 * rows × 128 columns of x: each thread loads RPT rows × 8 columns (16-byte loads, kept as
 * raw bf16; a warp reads 8 rows × 64 contiguous bytes per load), packs each column's codes
 * into RPT/4 words of the shared tile (laid out as the output: 128 rows of TT_ROWS bytes
 * and a word of padding), and the tile leaves as 16-byte stores of whole output rows.
 * Tiles run bottom to top, the reverse of colmax_kernel's and amax_kernel's order, for what
 * L2 still holds of x. vec_in: C a multiple of 8 and x 16-byte aligned; vec_out: R a
 * multiple of 16 and codes 16-byte aligned; partial tiles and the rest go element by
 * element. */
enum { TT_RPT = 8, TT_ROWS = 16 * TT_RPT, TT_COLS = 128 };
__device__ __forceinline__ float bf16_word_half(uint32_t w, int hi) {
    return __uint_as_float(hi ? w & 0xFFFF0000u : w << 16);
}
/* direct[(row + i)·C + col + j] = fp8(x[row + i, col + j] · scale) for the TT_RPT rows × 8
 * columns a transpose-cast thread holds as raw bf16 words (zeros past the edges); vec: all
 * in bounds, C a multiple of 8 and direct 8-byte aligned (one 8-byte store a row). */
template <int F>
__device__ __forceinline__ void direct_codes(uint8_t *direct, const uint4 *raw, int row, int col,
                                             int R, int C, float scale, bool vec) {
#pragma unroll
    for (int i = 0; i < TT_RPT; i++) {
        const uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
        uint32_t pair[4];
#pragma unroll
        for (int h = 0; h < 4; h++)
            pair[h] = fp8x2<F>(bf16_word_half(w[h], 0), bf16_word_half(w[h], 1), scale);
        uint8_t *dst = direct + (size_t)(row + i) * C + col;
        if (vec) {
            *reinterpret_cast<uint2 *>(dst) = make_uint2(pair[0] | pair[1] << 16, pair[2] | pair[3] << 16);
        } else if (row + i < R) {
            for (int j = 0; j < 8 && col + j < C; j++) dst[j] = (uint8_t)(pair[j >> 1] >> (8 * (j & 1)));
        }
    }
}
template <int F, bool ROWWISE, bool DIRECT>
__global__ void __launch_bounds__(Q_THREADS)
    transpose_cast_kernel(uint8_t *codes, const bf16 *x, int R, int C, const unsigned *amax_bits,
                          bool vec_in, bool vec_out, uint8_t *direct, bool vec_direct) {
    static_assert(!(ROWWISE && DIRECT), "the direct layout shares the tensorwise scale only");
    constexpr int W = TT_ROWS / 4; /* words of one output row of the tile */
    __shared__ uint32_t tile[TT_COLS][W + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tx = (warp & 3) * 4 + (lane & 3);   /* 8-column group, 0..15 */
    const int ty = (warp >> 2) * 8 + (lane >> 2); /* TT_RPT-row group, 0..15 */
    const int nty = (R + TT_ROWS - 1) / TT_ROWS;
    const int c0 = blockIdx.x * TT_COLS, col = c0 + tx * 8;
    float scale[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int cj = ROWWISE ? min(col + j, C - 1) : 0;
        scale[j] = fp8_scale_of<F>(__uint_as_float(amax_bits[cj]));
    }
    for (int t = blockIdx.y; t < nty; t += gridDim.y) {
        const int r0 = (nty - 1 - t) * TT_ROWS, row = r0 + ty * TT_RPT;
        const bool full = vec_in && row + TT_RPT <= R && col + 8 <= C;
        uint4 raw[TT_RPT];
#pragma unroll
        for (int i = 0; i < TT_RPT; i++) {
            const bf16 *p = x + (size_t)(row + i) * C + col;
            if (full) {
                raw[i] = *reinterpret_cast<const uint4 *>(p);
            } else {
                uint32_t w[4];
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    const int c = col + 2 * h;
                    const bool in = row + i < R;
                    const uint32_t lo = in && c < C ? __bfloat16_as_ushort(p[2 * h]) : 0u;
                    const uint32_t hi = in && c + 1 < C ? __bfloat16_as_ushort(p[2 * h + 1]) : 0u;
                    w[h] = lo | hi << 16;
                }
                raw[i] = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
        if (DIRECT) /* x's own layout from the same registers: 8 codes of each row */
            direct_codes<F>(direct, raw, row, col, R, C, scale[0], full && vec_direct);
        __syncthreads(); /* the previous tile's readers are done */
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int g = 0; g < TT_RPT / 4; g++) {
                float v[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint4 r = raw[4 * g + i];
                    const uint32_t w = (j >> 1) == 0 ? r.x : (j >> 1) == 1 ? r.y : (j >> 1) == 2 ? r.z : r.w;
                    v[i] = bf16_word_half(w, j & 1);
                }
                tile[tx * 8 + j][ty * (TT_RPT / 4) + g] =
                    fp8x2<F>(v[0], v[1], scale[j]) | fp8x2<F>(v[2], v[3], scale[j]) << 16;
            }
        }
        __syncthreads();
        for (int q = threadIdx.x; q < TT_COLS * (W / 4); q += Q_THREADS) {
            const int dr = q / (W / 4), ch = q % (W / 4), dc = c0 + dr, db = r0 + ch * 16;
            if (dc >= C || db >= R) continue;
            uint4 w = make_uint4(tile[dr][ch * 4], tile[dr][ch * 4 + 1], tile[dr][ch * 4 + 2],
                                 tile[dr][ch * 4 + 3]);
            uint8_t *dst = codes + (size_t)dc * R + db;
            if (vec_out && db + 16 <= R) {
                *reinterpret_cast<uint4 *>(dst) = w;
            } else {
                const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
                for (int b = 0; b < 16 && db + b < R; b++) dst[b] = (uint8_t)(ws[b >> 2] >> (8 * (b & 3)));
            }
        }
    }
}

/* scale_inv[i] = 1 / scale(amax[i]), and copy[i] too when copy is not NULL; amax may be
 * scale_inv itself (in place over the amax bits the passes above left there) */
template <int F>
__global__ void finalize_kernel(const float *amax, float *scale_inv, int n, float *copy) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = __frcp_rn(fp8_scale_of<F>(amax[i]));
    scale_inv[i] = v;
    if (copy) copy[i] = v;
}

/* ---- FP8 weights from fp32 parameters (ops.h fp8_param_*), E4M3 tensorwise ----
 * x = bf16(p) (round) or p; the scale from a = bf16(*amax) or *amax by the rule above.
 * bf16(x) is __float2bfloat16_rn, the rounding of the cpu backend's convert.c and of this
 * backend's f32_to_act (round to nearest even, NaN stays NaN). */
__device__ __forceinline__ float bf16_rne(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float param_scale_of(const float *amax, bool round) {
    const float a = *amax;
    return fp8_scale_of<SHLM_FP8_E4M3>(round ? bf16_rne(a) : a);
}
__device__ __forceinline__ uint32_t param_codes4(float4 f, float scale, bool round) {
    if (round) f = make_float4(bf16_rne(f.x), bf16_rne(f.y), bf16_rne(f.z), bf16_rne(f.w));
    return fp8x2<SHLM_FP8_E4M3>(f.x, f.y, scale) | fp8x2<SHLM_FP8_E4M3>(f.z, f.w, scale) << 16;
}

/* The split of a flat pass over n elements into a scalar head [0, head), 4-element groups
 * [head, head + 4·groups) read as float4 (and, for the cast, written as 4-byte words) and a
 * scalar tail; groups = 0 puts everything in the tail. The launchers choose head so that
 * every group is aligned. */
struct param_split {
    size_t head, groups;
};
/* calls one(k) for every element k of the head and the tail, grid-stride */
template <class One>
__device__ __forceinline__ void param_scalar_ends(size_t n, param_split s, One one) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = i; k < s.head; k += stride) one(k);
    for (size_t k = s.head + 4 * s.groups + i; k < n; k += stride) one(k);
}

/* *amax_bits = max(*amax_bits, max |p[i]|) over n fp32 (grid-stride; two float4 loads in
 * flight per thread over the aligned groups) */
__global__ void __launch_bounds__(Q_THREADS) param_amax_kernel(unsigned *amax_bits, const float *p,
                                                               size_t n, param_split s) {
    __shared__ float red[32];
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const float4 *pv = reinterpret_cast<const float4 *>(p + s.head);
    float m = 0.0f;
    for (size_t v = i; v < s.groups; v += 2 * stride) {
        const float4 a = pv[v];
        const bool two = v + stride < s.groups;
        const float4 b = two ? pv[v + stride] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        m = fmaxf(m, fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w))));
        m = fmaxf(m, fmaxf(fmaxf(fabsf(b.x), fabsf(b.y)), fmaxf(fabsf(b.z), fabsf(b.w))));
    }
    param_scalar_ends(n, s, [&](size_t k) { m = fmaxf(m, fabsf(p[k])); });
    m = block_max(m, red);
    if (threadIdx.x == 0) amax_merge(amax_bits, m);
}

/* one thread: *scale_inv = 1 / scale(a), finalize_kernel's arithmetic */
__global__ void param_scale_kernel(float *scale_inv, const float *amax, bool round) {
    *scale_inv = __frcp_rn(param_scale_of(amax, round));
}

/* codes[i] = e4m3(x_i · scale) over n; vec: the groups of s are aligned for both p (16
 * bytes) and codes (4 bytes), else s has no groups and every element is scalar. Two
 * float4 loads in flight per thread, a 4-byte store each. */
__global__ void __launch_bounds__(Q_THREADS) param_cast_kernel(uint8_t *codes, const float *p,
                                                               size_t n, const float *amax,
                                                               bool round, param_split s) {
    const float scale = param_scale_of(amax, round);
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const float4 *pv = reinterpret_cast<const float4 *>(p + s.head);
    uint32_t *cv = reinterpret_cast<uint32_t *>(codes + s.head);
    for (size_t v = i; v < s.groups; v += 2 * stride) {
        const float4 a = pv[v];
        const bool two = v + stride < s.groups;
        const float4 b = two ? pv[v + stride] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        cv[v] = param_codes4(a, scale, round);
        if (two) cv[v + stride] = param_codes4(b, scale, round);
    }
    param_scalar_ends(n, s, [&](size_t k) {
        const float x = p[k];
        codes[k] = fp8x1<SHLM_FP8_E4M3>(round ? bf16_rne(x) : x, scale);
    });
}

/* dst (cols x rows) = srcᵀ over bytes. A block takes tiles of TR_TILE x TR_TILE bytes of
 * src (one column of tiles, grid-stride over the rows of tiles): thread (rg, cg) loads
 * rows 4rg..4rg+3 x columns 16cg..16cg+15 of the tile (four 16-byte loads; a warp reads 4
 * rows x 128 contiguous bytes a load), transposes each 4 x 4 block of bytes in registers
 * (byte permutes) into 4 words, word j holding column 16cg + 4k + j over the 4 rows, and
 * stores them in the shared tile laid out as the output: row c of the tile is output row
 * c0 + c, word w of it output bytes 4w..4w+3. The words of row c sit XOR-swizzled by
 * ((c >> 4) & 7) << 2, which keeps each aligned group of 4 words together (a 16-byte
 * chunk of the output row moves as a whole) and spreads both the stores (32 lanes: rg
 * mod 4 and cg vary) and the 16-byte reads (8 lanes: one row, its 8 chunks) over all 32
 * banks. The tile then leaves as 16-byte stores of output rows, 128 contiguous bytes a
 * row. vec_in: cols a multiple of 16 and src 16-byte aligned; vec_out: rows a multiple
 * of 16 and dst 16-byte aligned; partial tiles and the rest go byte by byte. */
enum { TR_TILE = 128, TR_THREADS = 256 };
__device__ __forceinline__ uint32_t tr_swizzle(int c) { return (uint32_t)((c >> 4) & 7) << 2; }
__global__ void __launch_bounds__(TR_THREADS) transpose_kernel(uint8_t *dst, const uint8_t *src,
                                                              int rows, int cols, bool vec_in,
                                                              bool vec_out) {
    constexpr int W = TR_TILE / 4; /* words of one output row of the tile */
    __shared__ __align__(16) uint32_t tile[TR_TILE][W];
    const int cg = threadIdx.x & 7, rg = threadIdx.x >> 3; /* 16-byte column group, 4-row group */
    const int c0 = blockIdx.x * TR_TILE, col = c0 + 16 * cg;
    const int nty = (rows + TR_TILE - 1) / TR_TILE;
    for (int t = blockIdx.y; t < nty; t += gridDim.y) {
        const int r0 = t * TR_TILE, row = r0 + 4 * rg;
        const bool full = vec_in && row + 4 <= rows && col + 16 <= cols;
        uint32_t w[4][4]; /* w[i][k]: bytes 4k..4k+3 of the thread's row i */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint8_t *p = src + (size_t)(row + i) * cols + col;
            if (full) {
                const uint4 v = *reinterpret_cast<const uint4 *>(p);
                w[i][0] = v.x, w[i][1] = v.y, w[i][2] = v.z, w[i][3] = v.w;
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    uint32_t word = 0;
                    for (int b = 0; b < 4; b++)
                        if (row + i < rows && col + 4 * k + b < cols) word |= (uint32_t)p[4 * k + b] << (8 * b);
                    w[i][k] = word;
                }
            }
        }
        __syncthreads(); /* the previous tile's readers are done */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            /* rows a, b, c, d = w[0..3][k]: ab_lo = a0 b0 a1 b1, ab_hi = a2 b2 a3 b3 (low byte
             * first), likewise cd; then word j = a_j b_j c_j d_j */
            const uint32_t ab_lo = __byte_perm(w[0][k], w[1][k], 0x5140);
            const uint32_t ab_hi = __byte_perm(w[0][k], w[1][k], 0x7362);
            const uint32_t cd_lo = __byte_perm(w[2][k], w[3][k], 0x5140);
            const uint32_t cd_hi = __byte_perm(w[2][k], w[3][k], 0x7362);
            const uint32_t out[4] = {__byte_perm(ab_lo, cd_lo, 0x5410), __byte_perm(ab_lo, cd_lo, 0x7632),
                                     __byte_perm(ab_hi, cd_hi, 0x5410), __byte_perm(ab_hi, cd_hi, 0x7632)};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = 16 * cg + 4 * k + j;
                tile[c][(uint32_t)rg ^ tr_swizzle(c)] = out[j];
            }
        }
        __syncthreads();
        for (int q = threadIdx.x; q < TR_TILE * (W / 4); q += TR_THREADS) {
            const int c = q / (W / 4), ch = q % (W / 4), dc = c0 + c, db = r0 + 16 * ch;
            if (dc >= cols || db >= rows) continue;
            const uint4 v = *reinterpret_cast<const uint4 *>(&tile[c][(uint32_t)(4 * ch) ^ tr_swizzle(c)]);
            uint8_t *d = dst + (size_t)dc * rows + db;
            if (vec_out && db + 16 <= rows) {
                *reinterpret_cast<uint4 *>(d) = v;
            } else {
                const uint32_t ws[4] = {v.x, v.y, v.z, v.w};
                for (int b = 0; b < 16 && db + b < rows; b++) d[b] = (uint8_t)(ws[b >> 2] >> (8 * (b & 3)));
            }
        }
    }
}

/* The declared fallback of matmul_fp8, for what cuBLASLt's FP8 path does not take (K or N
 * not a multiple of 16, operands not 16-byte aligned, a scaling the library refuses):
 * out(M,N) = (Σ_k dec(a[m,k])·dec(b[n,k])) · sa · sb + c, the sum in fp32. 64×64 output
 * tiles over 16-deep slices of K decoded to fp32 in shared memory, 4×4 outputs per
 * thread (rows ty + 16i, columns tx + 16j). Correct for any shape, not fast. */
enum { FB_TILE = 64, FB_K = 16 };
template <int FA, int FB>
__global__ void __launch_bounds__(Q_THREADS)
    fallback_gemm_kernel(void *out, int out_f32, const void *c, const uint8_t *a, const uint8_t *b,
                         int M, int N, int K, const float *sa, const float *sb, bool rowwise) {
    __shared__ float as[FB_K][FB_TILE + 1], bs[FB_K][FB_TILE + 1];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int m0 = blockIdx.x * FB_TILE, n0 = blockIdx.y * FB_TILE;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += FB_K) {
        for (int e = threadIdx.x; e < FB_TILE * FB_K; e += Q_THREADS) {
            const int r = e / FB_K, kk = e % FB_K, k = k0 + kk;
            const int m = m0 + r, n = n0 + r;
            float va = 0.0f, vb = 0.0f;
            if (m < M && k < K)
                va = __half2float(__half(__nv_cvt_fp8_to_halfraw(a[(size_t)m * K + k], fp8_format<FA>::interp)));
            if (n < N && k < K)
                vb = __half2float(__half(__nv_cvt_fp8_to_halfraw(b[(size_t)n * K + k], fp8_format<FB>::interp)));
            as[kk][r] = va;
            bs[kk][r] = vb;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < FB_K; kk++) {
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(as[kk][ty + 16 * i], bs[kk][tx + 16 * j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int m = m0 + ty + 16 * i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int n = n0 + tx + 16 * j;
            if (n >= N) continue;
            const size_t o = (size_t)m * N + n;
            float v = acc[i][j] * sa[rowwise ? m : 0] * sb[rowwise ? n : 0];
            if (out_f32) {
                if (c) v += ((const float *)c)[o];
                ((float *)out)[o] = v;
            } else {
                if (c) v += __bfloat162float(((const bf16 *)c)[o]);
                ((bf16 *)out)[o] = __float2bfloat16_rn(v);
            }
        }
    }
}

/* ------------------------------------------------------------------ launchers */

static const char *format_name(shlm_fp8_format f) { return f == SHLM_FP8_E5M2 ? "e5m2" : "e4m3"; }
static const char *scaling_name(shlm_fp8_scaling s) {
    return s == SHLM_FP8_ROWWISE ? "rowwise" : "tensorwise";
}

extern "C" int shlm_cuda_fp8_check(char *why, size_t whylen) {
    int dev = 0;
    cudaDeviceProp p;
    if (shlm_cuda_bound_device(&dev, &p, why, whylen) != 0) return -1;
    if (!((p.major == 8 && p.minor == 9) || p.major == 9)) {
        snprintf(why, whylen, "device %d, %s (compute capability %d.%d), has no FP8 tensor "
                 "cores: FP8 matmuls need compute capability 8.9 or 9.x", dev, p.name, p.major,
                 p.minor);
        return -1;
    }
    /* FP8 matmuls (A/B scale pointers) are in cuBLASLt from 11.8 on */
    const size_t ver = cublasLtGetVersion();
    if (ver < 110800) {
        snprintf(why, whylen, "device %d, %s (compute capability %d.%d): this cuBLASLt (version "
                 "%zu) has no FP8 matmul; 11.8 or later needed", dev, p.name, p.major, p.minor,
                 ver);
        return -1;
    }
    return 0;
}

template <int F> static void quantize(const shlm_fp8_matrix *q, const bf16 *src, int transpose) {
    cudaStream_t s = shlm_cuda_stream();
    const int rows = q->rows, cols = q->cols, rowwise = q->scaling == SHLM_FP8_ROWWISE;
    const size_t n = (size_t)rows * cols;
    if (rowwise && !transpose) {
        const bool vec = cols % 8 == 0 && shlm_aligned(src, 16) && shlm_aligned(q->codes, 8);
        rowwise_kernel<F><<<rows, Q_THREADS, 0, s>>>(q->codes, q->scale_inv, src, cols, vec);
        CUDA_CHECK_LAST();
        return;
    }
    const int nscales = rowwise ? rows : 1;
    unsigned *amax = reinterpret_cast<unsigned *>(q->scale_inv);
    CUDA_CHECK(cudaMemsetAsync(amax, 0, (size_t)nscales * sizeof(float), s));
    if (n > 0) {
        const unsigned cap = (unsigned)shlm_cuda_sm_count() * 8;
        /* src is (rows, cols), or (cols, rows) when transposed */
        const int R = transpose ? cols : rows, C = transpose ? rows : cols;
        if (rowwise) {
            dim3 grid((unsigned)((C + 255) / 256), (unsigned)min((R + COLMAX_ROWS - 1) / COLMAX_ROWS, 65535));
            colmax_kernel<<<grid, Q_THREADS, 0, s>>>(amax, src, R, C, C % 8 == 0 && shlm_aligned(src, 16));
        } else {
            amax_kernel<<<shlm_cuda_blocks(n / 8, Q_THREADS, cap), Q_THREADS, 0, s>>>(
                amax, src, n, shlm_aligned(src, 16));
        }
        CUDA_CHECK_LAST();
        if (!transpose) {
            const bool vec = shlm_aligned(src, 16) && shlm_aligned(q->codes, 16);
            cast_kernel<F><<<shlm_cuda_blocks(n / 16, Q_THREADS, cap), Q_THREADS, 0, s>>>(
                q->codes, src, n, amax, vec);
        } else {
            dim3 grid((unsigned)((C + TT_COLS - 1) / TT_COLS), (unsigned)min((R + TT_ROWS - 1) / TT_ROWS, 65535));
            const bool vec_in = C % 8 == 0 && shlm_aligned(src, 16);
            const bool vec_out = R % 16 == 0 && shlm_aligned(q->codes, 16);
            if (rowwise)
                transpose_cast_kernel<F, true, false><<<grid, Q_THREADS, 0, s>>>(
                    q->codes, src, R, C, amax, vec_in, vec_out, nullptr, false);
            else
                transpose_cast_kernel<F, false, false><<<grid, Q_THREADS, 0, s>>>(
                    q->codes, src, R, C, amax, vec_in, vec_out, nullptr, false);
        }
        CUDA_CHECK_LAST();
    }
    finalize_kernel<F><<<(nscales + Q_THREADS - 1) / Q_THREADS, Q_THREADS, 0, s>>>(
        q->scale_inv, q->scale_inv, nscales, nullptr);
    CUDA_CHECK_LAST();
}

/* Tensorwise: one amax pass (none when the producer gave src_amax), then one
 * transpose-cast that writes q's layout as well from the registers it loaded (the two
 * calls' 5 bytes of traffic an element become 4: half of the two amax and cast reads; 3
 * with src_amax). Rowwise: q's rows and q_t's rows (src's columns) have amaxes of their
 * own, so it is the two calls. */
template <int F>
static void quantize_both(const shlm_fp8_matrix *q, const shlm_fp8_matrix *qt, const bf16 *src,
                          const float *src_amax) {
    if (q->scaling == SHLM_FP8_ROWWISE) {
        quantize<F>(q, src, 0);
        quantize<F>(qt, src, 1);
        return;
    }
    cudaStream_t s = shlm_cuda_stream();
    const int R = q->rows, C = q->cols;
    const size_t n = (size_t)R * C;
    unsigned *own = reinterpret_cast<unsigned *>(qt->scale_inv);
    const unsigned *amax = src_amax ? reinterpret_cast<const unsigned *>(src_amax) : own;
    if (!src_amax) CUDA_CHECK(cudaMemsetAsync(own, 0, sizeof(float), s));
    if (n > 0) {
        if (!src_amax) {
            const unsigned cap = (unsigned)shlm_cuda_sm_count() * 8;
            amax_kernel<<<shlm_cuda_blocks(n / 8, Q_THREADS, cap), Q_THREADS, 0, s>>>(
                own, src, n, shlm_aligned(src, 16));
            CUDA_CHECK_LAST();
        }
        dim3 grid((unsigned)((C + TT_COLS - 1) / TT_COLS), (unsigned)min((R + TT_ROWS - 1) / TT_ROWS, 65535));
        const bool vec_in = C % 8 == 0 && shlm_aligned(src, 16);
        const bool vec_out = R % 16 == 0 && shlm_aligned(qt->codes, 16);
        transpose_cast_kernel<F, false, true><<<grid, Q_THREADS, 0, s>>>(
            qt->codes, src, R, C, amax, vec_in, vec_out, q->codes, shlm_aligned(q->codes, 8));
        CUDA_CHECK_LAST();
    }
    finalize_kernel<F><<<1, 32, 0, s>>>(reinterpret_cast<const float *>(amax), qt->scale_inv, 1,
                                        q->scale_inv);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_fp8_quantize(const shlm_fp8_matrix *q, const void *src, int transpose) {
    if (q->rows < 0 || q->cols < 0)
        SHLM_FATAL("fp8_quantize: a %d x %d matrix", q->rows, q->cols);
    if (q->rows == 0) return;
    if (q->format == SHLM_FP8_E5M2) quantize<SHLM_FP8_E5M2>(q, (const bf16 *)src, transpose);
    else quantize<SHLM_FP8_E4M3>(q, (const bf16 *)src, transpose);
}

extern "C" void shlm_cuda_fp8_quantize_both(const shlm_fp8_matrix *q, const shlm_fp8_matrix *q_t,
                                            const void *src, const float *src_amax) {
    if (q->rows < 0 || q->cols < 0 || q_t->rows != q->cols || q_t->cols != q->rows ||
        q_t->format != q->format || q_t->scaling != q->scaling)
        SHLM_FATAL("fp8_quantize_both: q is %d x %d, q_t %d x %d (must be its transpose, same "
                   "format and scaling)", q->rows, q->cols, q_t->rows, q_t->cols);
    if (src_amax && q->scaling != SHLM_FP8_TENSORWISE)
        SHLM_FATAL("fp8_quantize_both: a given amax with rowwise scaling (one amax per row)");
    if (q->rows == 0 || q->cols == 0) return;
    if (q->format == SHLM_FP8_E5M2) quantize_both<SHLM_FP8_E5M2>(q, q_t, (const bf16 *)src, src_amax);
    else quantize_both<SHLM_FP8_E4M3>(q, q_t, (const bf16 *)src, src_amax);
}

/* ---- FP8 weights from fp32 parameters ---- */

/* head: the elements of p before its first 16-byte boundary (a float pointer is 4-byte
 * aligned, so its misalignment is a whole number of floats) */
static param_split split_at_float4(const float *p, size_t n) {
    const size_t mis = (uintptr_t)p & 15, head = mis ? (16 - mis) / sizeof(float) : 0;
    if (head >= n) return param_split{n, 0};
    return param_split{head, (n - head) / 4};
}
/* blocks for a pass of s over n elements: two groups a thread, or one element a thread
 * when every element is scalar */
static unsigned param_blocks(param_split s, size_t n) {
    const size_t work = s.groups ? (s.groups + 1) / 2 : n;
    return shlm_cuda_blocks(work, Q_THREADS, (size_t)shlm_cuda_sm_count() * 8);
}

extern "C" void shlm_cuda_fp8_param_amax(float *amax, const float *p, size_t n) {
    if (n == 0) return;
    const param_split s = split_at_float4(p, n);
    param_amax_kernel<<<param_blocks(s, n), Q_THREADS, 0, shlm_cuda_stream()>>>(
        reinterpret_cast<unsigned *>(amax), p, n, s);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_fp8_param_scale(float *scale_inv, const float *amax, int round_bf16) {
    param_scale_kernel<<<1, 1, 0, shlm_cuda_stream()>>>(scale_inv, amax, round_bf16 != 0);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_fp8_param_cast(uint8_t *codes, const float *p, size_t n, const float *amax,
                                         int round_bf16) {
    if (n == 0) return;
    /* the float4 groups start where p reaches a 16-byte boundary; their 4-byte stores are
     * aligned when codes reaches a 4-byte boundary at the same element, else (codes and p
     * misaligned differently) every element goes alone */
    param_split s = split_at_float4(p, n);
    if (s.groups && ((uintptr_t)(codes + s.head) & 3) != 0) s = param_split{0, 0};
    param_cast_kernel<<<param_blocks(s, n), Q_THREADS, 0, shlm_cuda_stream()>>>(codes, p, n, amax,
                                                                                 round_bf16 != 0, s);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_fp8_transpose(uint8_t *dst, const uint8_t *src, int rows, int cols) {
    if (rows < 0 || cols < 0) SHLM_FATAL("fp8_transpose: a %d x %d matrix", rows, cols);
    if (rows == 0 || cols == 0) return;
    dim3 grid((unsigned)((cols + TR_TILE - 1) / TR_TILE), (unsigned)min((rows + TR_TILE - 1) / TR_TILE, 65535));
    const bool vec_in = cols % 16 == 0 && shlm_aligned(src, 16);
    const bool vec_out = rows % 16 == 0 && shlm_aligned(dst, 16);
    transpose_kernel<<<grid, TR_THREADS, 0, shlm_cuda_stream()>>>(dst, src, rows, cols, vec_in, vec_out);
    CUDA_CHECK_LAST();
}

/* ---- the scaled product ---- */

static unsigned g_ran;

extern "C" unsigned shlm_cuda_fp8_matmul_ran(void) { return g_ran; }

static cudaDataType_t lt_type(shlm_fp8_format f) {
    return f == SHLM_FP8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
}

template <int FA, int FB>
static void fallback(void *out, int out_f32, const shlm_fp8_matrix *a, const shlm_fp8_matrix *b,
                     const void *c) {
    if ((b->rows + FB_TILE - 1) / FB_TILE > 65535)
        SHLM_FATAL("matmul_fp8: the fallback kernel takes b of at most %d rows, not %d",
                   65535 * FB_TILE, b->rows);
    dim3 grid((unsigned)((a->rows + FB_TILE - 1) / FB_TILE), (unsigned)((b->rows + FB_TILE - 1) / FB_TILE));
    fallback_gemm_kernel<FA, FB><<<grid, Q_THREADS, 0, shlm_cuda_stream()>>>(
        out, out_f32, c, a->codes, b->codes, a->rows, b->rows, a->cols, a->scale_inv,
        b->scale_inv, a->scaling == SHLM_FP8_ROWWISE);
}

extern "C" void shlm_cuda_matmul_fp8(void *out, int flags, const shlm_fp8_matrix *a,
                                     const shlm_fp8_matrix *b, const void *c) {
    const int M = a->rows, N = b->rows, K = a->cols, out_f32 = flags & SHLM_FP8_OUT_F32;
    if (b->cols != K || M < 0 || N < 0 || K < 0)
        SHLM_FATAL("matmul_fp8: a is %d x %d and b %d x %d (both need K = cols)", a->rows,
                   a->cols, b->rows, b->cols);
    if (a->scaling != b->scaling)
        SHLM_FATAL("matmul_fp8: a is %s and b %s (one scaling for both)", scaling_name(a->scaling),
                   scaling_name(b->scaling));
    if (a->format == SHLM_FP8_E5M2 && b->format == SHLM_FP8_E5M2)
        SHLM_FATAL("matmul_fp8: a and b are both e5m2 (at most one may be)");
    const size_t esz = out_f32 ? sizeof(float) : sizeof(bf16);
    if (M == 0 || N == 0) return;
    if (K == 0) { /* an empty sum: out = c or 0 */
        if (!c) shlm_cuda_zero(out, (size_t)M * N * esz);
        else if (c != out) shlm_cuda_copy(out, c, (size_t)M * N * esz);
        return;
    }
    const int rowwise = a->scaling == SHLM_FP8_ROWWISE;
    /* cuBLASLt's FP8 layout rules (TN only; 16-byte aligned operands and scale pointers:
     * it refuses a tensorwise scale that is not; K and the leading dimension of D multiples
     * of 16) */
    const int lt_shape = K % 16 == 0 && N % 16 == 0 && shlm_aligned(a->codes, 16) &&
                         shlm_aligned(b->codes, 16) && shlm_aligned(out, 16) &&
                         (!c || shlm_aligned(c, 16)) && shlm_aligned(a->scale_inv, 16) &&
                         shlm_aligned(b->scale_inv, 16);
    if (lt_shape) {
        /* row-major out(M,N) = a·bᵀ is column-major outᵀ(N,M) = op_T(b as (K,N)) · (a as
         * (K,M)): cuBLASLt's A is b (its scales along m = N), its B is a (along n = M) */
        shlm_lt_product g;
        memset(&g, 0, sizeof g);
        g.transa = 1, g.transb = 0;
        g.m = N, g.n = M, g.k = K, g.lda = K, g.ldb = K, g.ldc = N;
        g.atype = lt_type(b->format);
        g.btype = lt_type(a->format);
        g.ctype = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
        g.scale_mode = rowwise ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                               : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
        /* fp32 accumulation unless the caller allows fast accumulation, and never for fp32
         * outputs (weight gradients) */
        g.fast_accum = (flags & SHLM_FP8_FAST_ACCUM) && !out_f32;
        g.A = b->codes, g.B = a->codes, g.C = c ? c : out, g.D = out;
        g.a_scale = b->scale_inv, g.b_scale = a->scale_inv;
        g.beta = c ? 1.0f : 0.0f;
        if (shlm_cuda_lt_product(&g)) {
            g_ran = SHLM_FP8_RAN_CUBLASLT;
            CUDA_CHECK_LAST();
            return;
        }
        /* a shape the rules above let through and the library still refused: said once
         * per process, since every such call now runs the slow kernel */
        static int warned;
        if (!warned++)
            fprintf(stderr, "shardlm: warning: cuBLASLt runs no FP8 matmul out(%d,%d) = a(%d,%d) "
                    "%s x b(%d,%d)ᵀ %s, %s scales, %s out; the fallback kernel runs it (slow)\n",
                    M, N, M, K, format_name(a->format), N, K, format_name(b->format),
                    scaling_name(a->scaling), out_f32 ? "fp32" : "bf16");
    }
    g_ran = SHLM_FP8_RAN_FALLBACK;
    if (a->format == SHLM_FP8_E5M2) fallback<SHLM_FP8_E5M2, SHLM_FP8_E4M3>(out, out_f32, a, b, c);
    else if (b->format == SHLM_FP8_E5M2) fallback<SHLM_FP8_E4M3, SHLM_FP8_E5M2>(out, out_f32, a, b, c);
    else fallback<SHLM_FP8_E4M3, SHLM_FP8_E4M3>(out, out_f32, a, b, c);
    CUDA_CHECK_LAST();
}
