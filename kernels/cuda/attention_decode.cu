/* cuda backend KV-cache attention for generation (ops.h kv_append, attention_decode): the
 * new tokens' k, v appended to a bf16 cache, then their queries attended to it
 * flash-decoding style: the cache length split over blocks, partial softmaxes merged. */
#include "kernels/cuda/cuda_common.cuh"

#include <math.h>

/* Shapes (ops.h): qkv (B·Tn, (nh + 2·nkv)·hd) holds the new tokens; k_cache, v_cache
 * (B, nkv, cap, hd); pos (B) int32, the tokens row b held before this step; out
 * (B·Tn, nh·hd).
 *
 * A decode step reads the whole cache once and does ~4 flops per byte of it: the kernel is
 * written for bandwidth. One block per (row b, kv head, tile of up to ROWS query rows,
 * split of the cache length): every query head of a kv head (its GQA group, times Tn new
 * tokens) shares each load of the kv head's keys and values, and the splits give a batch
 * of one sequence enough blocks to keep every SM's loads in flight. A block streams its
 * split in tiles of 64 keys (16-byte cp.async loads of contiguous cache rows into shared
 * memory, rows padded by 16 bytes so that a warp's 16-byte row reads hit distinct banks),
 * computes the tile's scores (one thread per key and query rows), updates each row's
 * running max and sum (one warp per row), and accumulates P·V in fp32 registers (a thread
 * per 8 columns and a stride of keys). Scores are kept in the log2 domain (q pre-scaled
 * by log2(e)/√hd) so that exp is a bare ex2. P stays fp32: no rounding before P·V.
 * A split's partial (its max, sum and unnormalised output) goes to scratch and a second
 * kernel merges a row's splits (one warp per output row, splits in order); with a single
 * split the block writes out directly. The split count depends on the shape and cap only,
 * never on pos, so the launch needs nothing from the device; splits past a row's length
 * return at once. Deterministic: every sum runs in a fixed order. */

namespace {

constexpr float LOG2E = 1.4426950408889634f;
constexpr int DEC_THREADS = 128; /* 4 warps */
constexpr int DEC_KT = 64;       /* keys per tile */

/* 0 <= pos <= cap - Tn (ops.h): a row outside it is left alone and gets NaN outputs */
__device__ __forceinline__ bool row_fits(int p, int Tn, int cap) { return p >= 0 && p <= cap - Tn; }

/* k, v of token t of row b into slot pos[b] + t: one thread per 8 elements (vec: 16-byte
 * aligned rows, hd % 8 == 0) or per element */
__global__ void kv_append_kernel(bf16 *kc, bf16 *vc, const bf16 *qkv, const int32_t *pos, int B,
                                 int Tn, int cap, int nh, int nkv, int hd, bool vec) {
    const int per = vec ? hd / 8 : hd;
    const size_t total = (size_t)B * Tn * nkv * per;
    const size_t C3 = (size_t)(nh + 2 * nkv) * hd;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % per);
        const size_t r = i / per;
        const int kh = (int)(r % nkv);
        const int t = (int)(r / nkv % Tn);
        const int b = (int)(r / nkv / Tn);
        const int p = pos[b];
        if (!row_fits(p, Tn, cap)) continue;
        const bf16 *src = qkv + (size_t)(b * Tn + t) * C3 + (size_t)(nh + kh) * hd;
        const size_t at = (((size_t)b * nkv + kh) * cap + (size_t)(p + t)) * hd;
        if (vec) {
            const int d = 8 * c;
            *reinterpret_cast<bf16x8 *>(kc + at + d) = *reinterpret_cast<const bf16x8 *>(src + d);
            *reinterpret_cast<bf16x8 *>(vc + at + d) =
                *reinterpret_cast<const bf16x8 *>(src + (size_t)nkv * hd + d);
        } else {
            kc[at + c] = src[c];
            vc[at + c] = src[(size_t)nkv * hd + c];
        }
    }
}

/* Where a query row of a block lives: row r of tile rt of kv head kvh is query head
 * kvh·group + (rt·ROWS + r) % group of new token (rt·ROWS + r) / group. */
struct dec_args {
    int Tn, cap, nh, nkv, hd, group, row_tiles, chunk, splits;
    float scale_log2;
    bool vec;
};

/* grid (nkv · row_tiles, splits, B), DEC_THREADS threads. Keys [j·chunk, (j+1)·chunk) of
 * the row's cache, limited to those some row of the tile sees. With splits == 1: out;
 * else the partial of each of the tile's rows: part_acc[(o·splits + j)·hd + d] (the
 * unnormalised sum), part_ml[(o·splits + j)·2 + {0, 1}] (max in log2 units, sum of
 * exponentials), o = (b·Tn + t)·nh + h the output row. */
template <int HDP, int ROWS>
__global__ void __launch_bounds__(DEC_THREADS)
    decode_kernel(bf16 *out, float *part_acc, float *part_ml, const bf16 *qkv, const bf16 *kc,
                  const bf16 *vc, const int32_t *pos, dec_args a) {
    constexpr int SS = HDP + 8;          /* shared row stride of a K or V tile */
    constexpr int CG = HDP / 8;          /* 8-column groups of a row */
    constexpr int NKS = DEC_THREADS / CG; /* P·V: key strides */
    constexpr int RPT = (ROWS + 1) / 2;  /* scores: rows per thread (two threads per key) */
    constexpr int NW = DEC_THREADS / 32;
    static_assert(DEC_THREADS == 2 * DEC_KT, "scores: two threads per key");
    static_assert(NW * ROWS * HDP * 4 <= 2 * DEC_KT * SS * 2, "the reduction fits the K/V tiles");

    __shared__ __align__(16) float qs[ROWS][HDP];
    __shared__ __align__(16) unsigned char kv_raw[2 * DEC_KT * SS * sizeof(bf16)];
    __shared__ float sc[ROWS][DEC_KT];
    __shared__ float row_m[ROWS], row_l[ROWS], row_alpha[ROWS];
    bf16 *const ks = reinterpret_cast<bf16 *>(kv_raw);
    bf16 *const vs = ks + DEC_KT * SS;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = blockIdx.x / a.row_tiles, rt = blockIdx.x % a.row_tiles;
    const int j = blockIdx.y, b = blockIdx.z;
    const int R = a.group * a.Tn; /* query rows of this kv head */
    const int r0 = rt * ROWS;
    const int nrows = min(ROWS, R - r0);
    const int p0 = pos[b];
    const size_t CO = (size_t)a.nh * a.hd;

    if (!row_fits(p0, a.Tn, a.cap)) { /* the merge writes the NaN when there are splits */
        if (a.splits == 1)
            for (int i = tid; i < nrows * a.hd; i += DEC_THREADS) {
                const int rg = r0 + i / a.hd, t = rg / a.group, h = kvh * a.group + rg % a.group;
                out[(size_t)(b * a.Tn + t) * CO + (size_t)h * a.hd + i % a.hd] =
                    __float2bfloat16_rn(NAN);
            }
        return;
    }
    /* the keys of this split that the tile's last row (the latest token) sees */
    const int t_hi = (r0 + nrows - 1) / a.group;
    const int kbeg = j * a.chunk;
    const int kend = min(kbeg + a.chunk, p0 + t_hi + 1);
    if (kbeg >= kend) return;

    /* q, scaled into the log2 domain; rows past nrows and columns past hd are zero */
    const size_t C3 = (size_t)(a.nh + 2 * a.nkv) * a.hd;
    for (int i = tid; i < ROWS * HDP; i += DEC_THREADS) {
        const int r = i / HDP, d = i % HDP;
        float v = 0.0f;
        if (r < nrows && d < a.hd) {
            const int rg = r0 + r, t = rg / a.group, h = kvh * a.group + rg % a.group;
            v = __bfloat162float(qkv[(size_t)(b * a.Tn + t) * C3 + (size_t)h * a.hd + d]) *
                a.scale_log2;
        }
        qs[r][d] = v;
    }
    if (tid < ROWS) {
        row_m[tid] = -INFINITY;
        row_l[tid] = 0.0f;
    }
    /* the last key each of the thread's score rows sees (-1: none, a row past nrows) */
    const int s_key = tid % DEC_KT, r_first = tid / DEC_KT;
    int last[RPT];
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        const int r = r_first + 2 * i;
        last[i] = r < nrows ? p0 + (r0 + r) / a.group : -1;
    }
    const int cg = tid % CG, kst = tid / CG;
    float acc[ROWS][8];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[r][e] = 0.0f;

    const size_t head = (size_t)b * a.nkv + kvh;
    const bf16 *kbase = kc + head * a.cap * a.hd, *vbase = vc + head * a.cap * a.hd;
    for (int k0 = kbeg; k0 < kend; k0 += DEC_KT) {
        const int nk = min(DEC_KT, kend - k0);
        load_tile<DEC_KT, HDP, DEC_THREADS>(ks, kbase + (size_t)k0 * a.hd, a.hd, nk, a.hd, a.vec);
        load_tile<DEC_KT, HDP, DEC_THREADS>(vs, vbase + (size_t)k0 * a.hd, a.hd, nk, a.hd, a.vec);
        if (a.vec) {
            cp_async_commit();
            cp_async_wait_all();
        }
        __syncthreads(); /* the tiles, and (first tile) qs and the row state */

        /* scores of key s_key against the thread's rows; masked ones are -inf */
        {
            float s[RPT];
#pragma unroll
            for (int i = 0; i < RPT; i++) s[i] = 0.0f;
#pragma unroll 4
            for (int c = 0; c < CG; c++) {
                float k8[8];
                load_bf16x8(k8, ks + s_key * SS + 8 * c);
#pragma unroll
                for (int i = 0; i < RPT; i++) {
                    const int r = r_first + 2 * i;
                    if (r >= ROWS) continue;
                    const float4 qa = *reinterpret_cast<const float4 *>(&qs[r][8 * c]);
                    const float4 qb = *reinterpret_cast<const float4 *>(&qs[r][8 * c + 4]);
                    s[i] += qa.x * k8[0] + qa.y * k8[1] + qa.z * k8[2] + qa.w * k8[3] +
                            qb.x * k8[4] + qb.y * k8[5] + qb.z * k8[6] + qb.w * k8[7];
                }
            }
#pragma unroll
            for (int i = 0; i < RPT; i++) {
                const int r = r_first + 2 * i;
                if (r < ROWS)
                    sc[r][s_key] = s_key < nk && k0 + s_key <= last[i] ? s[i] : -INFINITY;
            }
        }
        __syncthreads();

        /* each row's running max and sum; sc becomes the tile's probabilities */
        for (int r = warp; r < ROWS; r += NW) {
            const float x0 = sc[r][lane], x1 = sc[r][lane + 32];
            const float m_old = row_m[r];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(x0, x1)));
            float p0v = 0.0f, p1v = 0.0f, alpha = 1.0f;
            if (m_new != -INFINITY) { /* else nothing seen yet: all stays zero */
                p0v = ex2(x0 - m_new);
                p1v = ex2(x1 - m_new);
                alpha = ex2(m_old - m_new);
            }
            const float l_new = row_l[r] * alpha + warp_sum(p0v + p1v);
            sc[r][lane] = p0v;
            sc[r][lane + 32] = p1v;
            __syncwarp();
            if (lane == 0) {
                row_m[r] = m_new;
                row_l[r] = l_new;
                row_alpha[r] = alpha;
            }
        }
        __syncthreads();

        /* acc = acc·alpha + P·V over the thread's keys kst, kst + NKS, ... */
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const float al = row_alpha[r];
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r][e] *= al;
        }
        for (int s = kst; s < nk; s += NKS) {
            float v8[8];
            load_bf16x8(v8, vs + s * SS + 8 * cg);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const float p = sc[r][s];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[r][e] += p * v8[e];
            }
        }
        __syncthreads(); /* the next tile overwrites ks, vs and sc */
    }

    /* the key strides' sums: over the lanes of a warp with the same columns, then over
     * the warps in order, through the K/V tiles' memory */
#pragma unroll
    for (int o = CG; o < 32; o <<= 1)
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r][e] += __shfl_xor_sync(0xffffffffu, acc[r][e], o);
    float *red = reinterpret_cast<float *>(kv_raw); /* [NW][ROWS][HDP] */
    if (lane < CG)
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int e = 0; e < 8; e++) red[((size_t)warp * ROWS + r) * HDP + 8 * cg + e] = acc[r][e];
    __syncthreads();
    for (int i = tid; i < nrows * HDP; i += DEC_THREADS) {
        const int r = i / HDP, d = i % HDP;
        if (d >= a.hd) continue;
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) o += red[((size_t)w * ROWS + r) * HDP + d];
        const int rg = r0 + r, t = rg / a.group, h = kvh * a.group + rg % a.group;
        const size_t orow = (size_t)(b * a.Tn + t) * a.nh + h;
        if (a.splits == 1) {
            out[orow * a.hd + d] = __float2bfloat16_rn(o / row_l[r]);
        } else {
            part_acc[(orow * a.splits + j) * a.hd + d] = o;
            if (d == 0) {
                part_ml[(orow * a.splits + j) * 2] = row_m[r];
                part_ml[(orow * a.splits + j) * 2 + 1] = row_l[r];
            }
        }
    }
}

/* One warp per output row o = (b·Tn + t)·nh + h: the splits that hold its keys 0..pos[b]+t
 * (the first (pos[b] + t)/chunk + 1), merged in order: out = Σ 2^(m_j - M)·acc_j /
 * Σ 2^(m_j - M)·l_j, M = max m_j. */
__global__ void decode_merge_kernel(bf16 *out, const float *part_acc, const float *part_ml,
                                    const int32_t *pos, int B, int Tn, int cap, int nh, int hd,
                                    int chunk, int splits) {
    const int lane = threadIdx.x & 31;
    const size_t o = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (o >= (size_t)B * Tn * nh) return;
    const int t = (int)(o / nh % Tn), b = (int)(o / nh / Tn);
    const int p = pos[b];
    bf16 *dst = out + o * hd;
    if (!row_fits(p, Tn, cap)) {
        for (int d = lane; d < hd; d += 32) dst[d] = __float2bfloat16_rn(NAN);
        return;
    }
    const int used = (p + t) / chunk + 1;
    const float *ml = part_ml + o * splits * 2;
    float M = -INFINITY;
    for (int j = lane; j < used; j += 32) M = fmaxf(M, ml[2 * j]);
    M = warp_max(M);
    float L = 0.0f;
    for (int j = lane; j < used; j += 32) L += ex2(ml[2 * j] - M) * ml[2 * j + 1];
    L = warp_sum(L);
    const float inv = 1.0f / L;
    const float *acc = part_acc + o * splits * hd;
    for (int d = lane; d < hd; d += 32) {
        float s = 0.0f;
        for (int j = 0; j < used; j++) s += ex2(ml[2 * j] - M) * acc[(size_t)j * hd + d];
        dst[d] = __float2bfloat16_rn(s * inv);
    }
}

void check_shape(const char *what, int B, int Tn, int cap, int nh, int nkv, int hd) {
    if (nh <= 0 || nkv <= 0 || nh % nkv != 0 || hd <= 0)
        SHLM_FATAL("%s: need n_heads %% n_kv_heads == 0 and positive sizes (nh=%d nkv=%d hd=%d)",
                   what, nh, nkv, hd);
    if (hd > 128) SHLM_FATAL("%s: head_dim %d > 128 is not supported by the cuda kernels", what, hd);
    if (cap < Tn) SHLM_FATAL("%s: %d new tokens do not fit a cache of %d", what, Tn, cap);
    if (B > 65535) SHLM_FATAL("%s: %d rows exceed the cuda grid's 65535", what, B);
}

void append(void *k_cache, void *v_cache, const void *qkv, const int32_t *pos, int B, int Tn,
            int cap, int nh, int nkv, int hd) {
    const bool vec = hd % 8 == 0 && shlm_aligned(qkv, 16) && shlm_aligned(k_cache, 16) &&
                     shlm_aligned(v_cache, 16);
    const size_t work = (size_t)B * Tn * nkv * (vec ? hd / 8 : hd);
    const size_t cap_blocks = (size_t)shlm_cuda_sm_count() * 32;
    kv_append_kernel<<<shlm_cuda_blocks(work, 256, cap_blocks), 256, 0, shlm_cuda_stream()>>>(
        (bf16 *)k_cache, (bf16 *)v_cache, (const bf16 *)qkv, pos, B, Tn, cap, nh, nkv, hd, vec);
    CUDA_CHECK_LAST();
}

template <int HDP, int ROWS>
void decode_launch(dim3 grid, bf16 *out, float *pacc, float *pml, const bf16 *qkv, const bf16 *kc,
                   const bf16 *vc, const int32_t *pos, const dec_args &a) {
    decode_kernel<HDP, ROWS><<<grid, DEC_THREADS, 0, shlm_cuda_stream()>>>(out, pacc, pml, qkv,
                                                                         kc, vc, pos, a);
    CUDA_CHECK_LAST();
}

template <int HDP>
void decode_rows(int rows, dim3 grid, bf16 *out, float *pacc, float *pml, const bf16 *qkv,
                 const bf16 *kc, const bf16 *vc, const int32_t *pos, const dec_args &a) {
    if (rows == 1) decode_launch<HDP, 1>(grid, out, pacc, pml, qkv, kc, vc, pos, a);
    else if (rows == 2) decode_launch<HDP, 2>(grid, out, pacc, pml, qkv, kc, vc, pos, a);
    else if (rows == 4) decode_launch<HDP, 4>(grid, out, pacc, pml, qkv, kc, vc, pos, a);
    else decode_launch<HDP, 8>(grid, out, pacc, pml, qkv, kc, vc, pos, a);
}

} // namespace

extern "C" void shlm_cuda_kv_append(void *k_cache, void *v_cache, const void *qkv,
                                    const int32_t *pos, int B, int Tn, int cap, int nh, int nkv,
                                    int hd) {
    if (B <= 0 || Tn <= 0) return;
    check_shape("kv_append", B, Tn, cap, nh, nkv, hd);
    append(k_cache, v_cache, qkv, pos, B, Tn, cap, nh, nkv, hd);
}

extern "C" void shlm_cuda_attention_decode(void *out, void *k_cache, void *v_cache,
                                           const void *qkv, const int32_t *pos, int B, int Tn,
                                           int cap, int nh, int nkv, int hd) {
    if (B <= 0 || Tn <= 0) return;
    check_shape("attention_decode", B, Tn, cap, nh, nkv, hd);
    append(k_cache, v_cache, qkv, pos, B, Tn, cap, nh, nkv, hd);

    dec_args a;
    a.Tn = Tn;
    a.cap = cap;
    a.nh = nh;
    a.nkv = nkv;
    a.hd = hd;
    a.group = nh / nkv;
    a.scale_log2 = (float)(1.0 / sqrt((double)hd)) * LOG2E;
    a.vec = hd % 8 == 0 && shlm_aligned(k_cache, 16) && shlm_aligned(v_cache, 16);
    /* query rows per block: the whole GQA group (times Tn) up to 8 */
    const int R = a.group * Tn;
    int rows = 1;
    while (rows < R && rows < 8) rows <<= 1;
    a.row_tiles = (R + rows - 1) / rows;
    /* splits: enough blocks for four per SM over the whole cache, in whole tiles */
    const long per_split = (long)B * nkv * a.row_tiles;
    const long want = (4L * shlm_cuda_sm_count() + per_split - 1) / per_split;
    const int tiles = (cap + DEC_KT - 1) / DEC_KT;
    const int splits0 = (int)(want < 1 ? 1 : want > tiles ? tiles : want);
    a.chunk = (tiles + splits0 - 1) / splits0 * DEC_KT;
    a.splits = (cap + a.chunk - 1) / a.chunk;
    if ((long)nkv * a.row_tiles > 0x7fffffffL)
        SHLM_FATAL("attention_decode: %d kv heads x %d row tiles exceed the cuda grid", nkv,
                   a.row_tiles);

    float *pacc = NULL, *pml = NULL;
    const size_t orows = (size_t)B * Tn * nh;
    if (a.splits > 1) {
        const size_t acc_bytes = (orows * a.splits * hd * sizeof(float) + 255) / 256 * 256;
        unsigned char *scr = (unsigned char *)shlm_cuda_scratch(
            acc_bytes + orows * a.splits * 2 * sizeof(float));
        pacc = (float *)scr;
        pml = (float *)(scr + acc_bytes);
    }
    const dim3 grid((unsigned)(nkv * a.row_tiles), (unsigned)a.splits, (unsigned)B);
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)qkv, *kc = (const bf16 *)k_cache, *vc = (const bf16 *)v_cache;
    if (hd <= 32) decode_rows<32>(rows, grid, o, pacc, pml, x, kc, vc, pos, a);
    else if (hd <= 64) decode_rows<64>(rows, grid, o, pacc, pml, x, kc, vc, pos, a);
    else decode_rows<128>(rows, grid, o, pacc, pml, x, kc, vc, pos, a);
    if (a.splits > 1) {
        const size_t threads = orows * 32;
        decode_merge_kernel<<<(unsigned)((threads + 127) / 128), 128, 0, shlm_cuda_stream()>>>(
            o, pacc, pml, pos, B, Tn, cap, nh, hd, a.chunk, a.splits);
        CUDA_CHECK_LAST();
    }
}
