/* The NF4 code books and the host quantizer of kernels/nf4.h: bitsandbytes 0.50.2's
 * quantize_4bit(quant_type="nf4", blocksize=64) and its nested 8-bit statistics, rounding by
 * rounding, so that the codes and scales equal the ones it makes on the CPU. */
#include "kernels/nf4.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/bf16.h"
#include "kernels/check.h"

/* bitsandbytes' get_4bit_type("nf4") (and its C++ nf4_lut), each literal rounded to fp32 */
const float shlm_nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f,
};

/* bitsandbytes' create_dynamic_map() (signed, 7 exponent bits, 8 bits: 127 magnitudes of
 * each sign over 10^-6 .. 1, then 0 and 1), ascending: the fp32 values torch's vectorized CPU
 * kernels (AVX2, AVX-512) compute for it (its scalar default kernels put 42 of them one ulp
 * away), in 9 significant digits, enough for every fp32 to come back exactly */
const float shlm_nf4_dq_code[256] = {
    -0.992968738f, -0.978906274f, -0.96484375f, -0.950781226f, -0.936718762f, -0.922656238f,
    -0.908593774f, -0.89453125f, -0.880468726f, -0.866406262f, -0.852343738f, -0.838281274f,
    -0.82421875f, -0.810156226f, -0.796093762f, -0.782031238f, -0.767968774f, -0.75390625f,
    -0.739843726f, -0.725781262f, -0.711718798f, -0.697656274f, -0.68359375f, -0.669531226f,
    -0.655468762f, -0.641406298f, -0.627343774f, -0.61328125f, -0.599218726f, -0.585156262f,
    -0.571093798f, -0.557031274f, -0.54296875f, -0.528906226f, -0.514843702f, -0.500781238f,
    -0.486718714f, -0.47265625f, -0.458593726f, -0.444531262f, -0.430468738f, -0.416406244f,
    -0.40234375f, -0.388281226f, -0.374218762f, -0.360156238f, -0.346093744f, -0.33203125f,
    -0.317968726f, -0.303906262f, -0.289843738f, -0.275781274f, -0.26171875f, -0.247656241f,
    -0.233593747f, -0.219531253f, -0.205468744f, -0.19140625f, -0.177343756f, -0.163281247f,
    -0.149218753f, -0.135156244f, -0.12109375f, -0.107031256f, -0.0985937491f, -0.0957812592f,
    -0.0929687545f, -0.0901562497f, -0.0873437524f, -0.0845312476f, -0.0817187577f,
    -0.078906253f, -0.0760937482f, -0.0732812509f, -0.0704687461f, -0.0676562563f,
    -0.0648437515f, -0.0620312504f, -0.0592187531f, -0.0564062484f, -0.053593751f,
    -0.05078125f, -0.047968749f, -0.0451562516f, -0.0423437469f, -0.0395312496f,
    -0.0367187522f, -0.0339062512f, -0.0310937501f, -0.028281251f, -0.0254687499f,
    -0.0226562507f, -0.0198437516f, -0.0170312505f, -0.0142187504f, -0.0114062503f,
    -0.00971874967f, -0.00915624946f, -0.00859375019f, -0.00803124998f, -0.00746874977f,
    -0.00690625003f, -0.00634374982f, -0.00578125007f, -0.00521875033f, -0.00465624966f,
    -0.00409374991f, -0.00353124971f, -0.00296874996f, -0.00240624999f, -0.00184375001f,
    -0.00128124992f, -0.000943750085f, -0.000831249985f, -0.00071875006f, -0.000606250076f,
    -0.000493750034f, -0.000381250022f, -0.000268750038f, -0.000156250011f, -8.87499991e-05f,
    -6.62500024e-05f, -4.37499984e-05f, -2.12499981e-05f, -7.7499999e-06f, -3.25000019e-06f,
    -5.50000038e-07f, 0.0f, 5.50000038e-07f, 3.25000019e-06f, 7.7499999e-06f, 2.12499981e-05f,
    4.37499984e-05f, 6.62500024e-05f, 8.87499991e-05f, 0.000156250011f, 0.000268750038f,
    0.000381250022f, 0.000493750034f, 0.000606250076f, 0.00071875006f, 0.000831249985f,
    0.000943750085f, 0.00128124992f, 0.00184375001f, 0.00240624999f, 0.00296874996f,
    0.00353124971f, 0.00409374991f, 0.00465624966f, 0.00521875033f, 0.00578125007f,
    0.00634374982f, 0.00690625003f, 0.00746874977f, 0.00803124998f, 0.00859375019f,
    0.00915624946f, 0.00971874967f, 0.0114062503f, 0.0142187504f, 0.0170312505f, 0.0198437516f,
    0.0226562507f, 0.0254687499f, 0.028281251f, 0.0310937501f, 0.0339062512f, 0.0367187522f,
    0.0395312496f, 0.0423437469f, 0.0451562516f, 0.047968749f, 0.05078125f, 0.053593751f,
    0.0564062484f, 0.0592187531f, 0.0620312504f, 0.0648437515f, 0.0676562563f, 0.0704687461f,
    0.0732812509f, 0.0760937482f, 0.078906253f, 0.0817187577f, 0.0845312476f, 0.0873437524f,
    0.0901562497f, 0.0929687545f, 0.0957812592f, 0.0985937491f, 0.107031256f, 0.12109375f,
    0.135156244f, 0.149218753f, 0.163281247f, 0.177343756f, 0.19140625f, 0.205468744f,
    0.219531253f, 0.233593747f, 0.247656241f, 0.26171875f, 0.275781274f, 0.289843738f,
    0.303906262f, 0.317968726f, 0.33203125f, 0.346093744f, 0.360156238f, 0.374218762f,
    0.388281226f, 0.40234375f, 0.416406244f, 0.430468738f, 0.444531262f, 0.458593726f,
    0.47265625f, 0.486718714f, 0.500781238f, 0.514843702f, 0.528906226f, 0.54296875f,
    0.557031274f, 0.571093798f, 0.585156262f, 0.599218726f, 0.61328125f, 0.627343774f,
    0.641406298f, 0.655468762f, 0.669531226f, 0.68359375f, 0.697656274f, 0.711718798f,
    0.725781262f, 0.739843726f, 0.75390625f, 0.767968774f, 0.782031238f, 0.796093762f,
    0.810156226f, 0.82421875f, 0.838281274f, 0.852343738f, 0.866406262f, 0.880468726f,
    0.89453125f, 0.908593774f, 0.922656238f, 0.936718762f, 0.950781226f, 0.96484375f,
    0.978906274f, 0.992968738f, 1.0f,
};

/* ---------------------------------------------------------------- the offset's sum
 * bitsandbytes takes offset = absmax.mean(), which torch computes on the CPU as an fp32 sum
 * (ATen's cascade_sum, native/cpu/SumKernel.cpp) divided by the count in fp32. The order of
 * that sum is part of the result, so it is followed here: the values as vectors of
 * TORCH_LANES lanes, four vectors to a row (ILP), rows summed into the first of four levels
 * of accumulators, a level pushed into the next one every 2^p rows (p = max(4,
 * ceil(log2 rows) / 4)), then the rows left over, the levels, the vectors left over, the
 * values after the last whole vector and finally the lanes in order. TORCH_LANES is
 * Vectorized<float>'s width in torch's AVX2 kernels (32 bytes); its AVX-512 kernels use 16
 * lanes and may round the mean differently in its last bit, so the reference test pins
 * ATEN_CPU_CAPABILITY=avx2 (tests/nf4_ref.py). torch also splits a sum of 32768 values or
 * more between its threads: the test runs it on one. */
enum { TORCH_LANES = 8, TORCH_ILP = 4, TORCH_LEVELS = 4 };

/* ATen's utils::CeilLog2 */
static int ceil_log2(size_t x) {
    int b = 0;
    if (x <= 2) return 1;
    for (x -= 1; x; x >>= 1) b++;
    return b;
}

/* multi_row_sum: rows r < `rows` of TORCH_ILP units of w lanes, unit k lane l of row r at
 * x[(r·TORCH_ILP + k)·w + l]; out[k][l] the cascade sum over the rows */
static void cascade_rows(float out[TORCH_ILP][TORCH_LANES], const float *x, size_t rows, int w) {
    float acc[TORCH_LEVELS][TORCH_ILP][TORCH_LANES] = {{{0}}};
    int p = ceil_log2(rows) / TORCH_LEVELS;
    if (p < 4) p = 4;
    const size_t step = (size_t)1 << p, mask = step - 1;
    size_t r = 0;
    while (r + step <= rows) {
        for (size_t j = 0; j < step; j++, r++)
            for (int k = 0; k < TORCH_ILP; k++)
                for (int l = 0; l < w; l++) acc[0][k][l] += x[(r * TORCH_ILP + k) * w + l];
        for (int j = 1; j < TORCH_LEVELS; j++) {
            for (int k = 0; k < TORCH_ILP; k++)
                for (int l = 0; l < w; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if (r & (mask << (j * p))) break;
        }
    }
    for (; r < rows; r++)
        for (int k = 0; k < TORCH_ILP; k++)
            for (int l = 0; l < w; l++) acc[0][k][l] += x[(r * TORCH_ILP + k) * w + l];
    for (int j = 1; j < TORCH_LEVELS; j++)
        for (int k = 0; k < TORCH_ILP; k++)
            for (int l = 0; l < w; l++) acc[0][k][l] += acc[j][k][l];
    for (int k = 0; k < TORCH_ILP; k++)
        for (int l = 0; l < w; l++) out[k][l] = acc[0][k][l];
}

/* row_sum: `units` units of w lanes at x, the lanes kept apart (out[l]) */
static void row_sum(float out[TORCH_LANES], const float *x, size_t units, int w) {
    float part[TORCH_ILP][TORCH_LANES];
    const size_t rows = units / TORCH_ILP;
    cascade_rows(part, x, rows, w);
    for (size_t u = rows * TORCH_ILP; u < units; u++)
        for (int l = 0; l < w; l++) part[0][l] += x[u * w + l];
    for (int k = 1; k < TORCH_ILP; k++)
        for (int l = 0; l < w; l++) part[0][l] += part[k][l];
    for (int l = 0; l < w; l++) out[l] = part[0][l];
}

/* torch.mean of n fp32 values on one thread (n >= 1) */
static float torch_mean(const float *x, size_t n) {
    float lanes[TORCH_LANES], s;
    if (n >= TORCH_LANES) { /* vectorized_inner_sum */
        const size_t vecs = n / TORCH_LANES;
        row_sum(lanes, x, vecs, TORCH_LANES);
        s = 0.0f;
        for (size_t i = vecs * TORCH_LANES; i < n; i++) s += x[i];
        for (int l = 0; l < TORCH_LANES; l++) s += lanes[l];
    } else { /* a scalar row_sum */
        row_sum(lanes, x, n, 1);
        s = lanes[0];
    }
    return (0.0f + s) / (float)n; /* the sum lands on a zeroed output, then div_(n) */
}

/* ---------------------------------------------------------------- the 4-bit codes */

/* bitsandbytes' default quantize_4bit on the CPU (backends/default/ops.py): the scaled value
 * goes to torch.bucketize over the fp32 midpoints of neighbouring levels, right=False: its
 * code is the number of midpoints strictly below it (a value on a midpoint takes the lower
 * level). The clamp to [-1, 1] before it changes no code, every midpoint lying inside. */
static uint8_t nf4_index(float s, const float mid[15]) {
    int c = 0;
    for (int k = 0; k < 15; k++) c += mid[k] < s;
    return (uint8_t)c;
}

/* ---------------------------------------------------------------- the 8-bit statistics */

/* bitsandbytes' CPU blockwise 8-bit rule (csrc/cpu_ops.cpp, quantize_cpu_impl, which the
 * nested statistics go through): t = v · (1 / absmax2) clamped to [-1, 1] falls in one of
 * 65536 bins, j = trunc((t + 1) · 0.5 · 65535 + 0.5) (its last multiply-add fused, as the
 * shipped library's instructions do it; unfused gives the same j for every fp32 t in
 * [-1, 1]), and bin j takes the code of its value -1 + 2j / 65535: the number of midpoints
 * of neighbouring codes strictly below it, not the code nearest t itself. A group whose
 * values are all 0 gets absmax2 0 and codes 0. */
static uint8_t dq_index(float t, const float mid[255]) {
    if (t < -1.0f) t = -1.0f;
    else if (t > 1.0f) t = 1.0f;
    const float h = (t + 1.0f) * 0.5f;
    const int j = (int)fmaf(h, 65535.0f, 0.5f);
    const float val = -1.0f + (2.0f * (float)j) / 65535.0f;
    int lo = 0, hi = 255;
    while (lo < hi) {
        const int m = (lo + hi) / 2;
        if (mid[m] < val) lo = m + 1;
        else hi = m;
    }
    return (uint8_t)lo;
}

static void quantize_absmax(const shlm_nf4 *q, const float *absmax, size_t nb) {
    const float offset = torch_mean(absmax, nb);
    float mid[255];
    for (int k = 0; k < 255; k++) mid[k] = 0.5f * (shlm_nf4_dq_code[k] + shlm_nf4_dq_code[k + 1]);
    *q->offset = offset;
    const size_t ng = (nb + SHLM_NF4_DQ_GROUP - 1) / SHLM_NF4_DQ_GROUP;
#pragma omp parallel for schedule(static)
    for (size_t g = 0; g < ng; g++) {
        const size_t lo = g * SHLM_NF4_DQ_GROUP;
        const size_t hi = lo + SHLM_NF4_DQ_GROUP < nb ? lo + SHLM_NF4_DQ_GROUP : nb;
        float a2 = 0.0f;
        for (size_t b = lo; b < hi; b++) a2 = fmaxf(a2, fabsf(absmax[b] - offset));
        q->absmax2[g] = a2;
        const float inv = a2 == 0.0f ? 0.0f : 1.0f / a2;
        for (size_t b = lo; b < hi; b++)
            q->absmax_codes[b] = a2 == 0.0f ? 0 : dq_index((absmax[b] - offset) * inv, mid);
    }
}

/* ---------------------------------------------------------------- the quantizer */

/* xf or xb (the other NULL) */
static int quantize(const shlm_nf4 *q, const float *xf, const uint16_t *xb, size_t *bad) {
    const size_t n = q->n, nb = shlm_nf4_blocks(n);
    if (n == 0) return 0;
    float *absmax = q->absmax;
    if (!absmax) {
        absmax = malloc(nb * sizeof(float));
        SHLM_CHECK_ALLOC(absmax);
    }
    float mid[15];
    for (int k = 0; k < 15; k++) mid[k] = (shlm_nf4_code[k] + shlm_nf4_code[k + 1]) / 2.0f;
    size_t first_bad = SIZE_MAX;
#pragma omp parallel for schedule(static) reduction(min : first_bad)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * SHLM_NF4_BLOCK;
        const size_t len = n - lo < SHLM_NF4_BLOCK ? n - lo : SHLM_NF4_BLOCK;
        float v[SHLM_NF4_BLOCK], am = 0.0f;
        for (size_t k = 0; k < len; k++) {
            v[k] = xf ? xf[lo + k] : shlm_bf16_to_f32(xb[lo + k]);
            if (!isfinite(v[k]) && lo + k < first_bad) first_bad = lo + k;
            am = fmaxf(am, fabsf(v[k]));
        }
        /* a full block multiplies by the reciprocal of max(absmax, 1e-38) and keeps its
         * absmax as it is; the partial last one divides by its clamped absmax and keeps
         * that (torch: A * (1 / absmax.clamp(min=1e-38)), and A / am with am clamped) */
        const int partial = len < SHLM_NF4_BLOCK;
        if (partial) am = fmaxf(am, 1e-38f);
        absmax[b] = am;
        const float inv = 1.0f / fmaxf(am, 1e-38f);
        uint8_t c[SHLM_NF4_BLOCK];
        for (size_t k = 0; k < len; k++) c[k] = nf4_index(partial ? v[k] / am : v[k] * inv, mid);
        if (len % 2) c[len] = 7; /* the padding value 0 */
        for (size_t k = 0; k < len; k += 2) q->codes[(lo + k) / 2] = (uint8_t)(c[k] << 4 | c[k + 1]);
    }
    if (first_bad != SIZE_MAX) {
        if (bad) *bad = first_bad;
        if (!q->absmax) free(absmax);
        return -1;
    }
    if (!q->absmax) {
        quantize_absmax(q, absmax, nb);
        free(absmax);
    }
    return 0;
}

int shlm_nf4_quantize(const shlm_nf4 *q, const float *x, size_t *bad) {
    return quantize(q, x, NULL, bad);
}

int shlm_nf4_quantize_bf16(const shlm_nf4 *q, const uint16_t *x, size_t *bad) {
    return quantize(q, NULL, x, bad);
}
