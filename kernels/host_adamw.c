/* AdamW on host memory (see host_adamw.h): one scalar loop and its AVX2 and AVX-512 twins,
 * the widest the CPU runs picked once, split over the OpenMP threads. */

/* A fused multiply-add rounds once where the scalar loop rounds twice: contraction off for
 * every function of this file, whatever the flags or the target attributes allow. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "kernels/host_adamw.h"

#include <math.h>
#include <omp.h>

#include "kernels/bf16.h"
#include "kernels/check.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define HOST_ADAMW_X86 1
#include <immintrin.h>
#endif

typedef struct adamw_coef {
    float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, grad_scale;
    float bc1, bc2;
} adamw_coef;

static adamw_coef coef_of(float lr, float beta1, float beta2, float eps, float weight_decay,
                          float grad_scale, int step) {
    if (step < 1) SHLM_FATAL("adamw: step %d, but steps count from 1", step);
    /* bias corrections in double: 1 − β2^t is ~1e-3 at t = 1, where fp32 pow loses digits */
    return (adamw_coef){lr, beta1, beta2, 1.0f - beta1, 1.0f - beta2, eps, weight_decay,
                        grad_scale, (float)(1.0 / (1.0 - pow((double)beta1, step))),
                        (float)(1.0 / (1.0 - pow((double)beta2, step)))};
}

/* The reference order every instruction set follows, element i of [i0, i1). */
static void adamw_scalar(const adamw_coef *c, float *param, const float *grad, float *m,
                         float *v, size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; i++) {
        float g = grad[i] * c->grad_scale;
        float mi = c->beta1 * m[i] + c->one_minus_beta1 * g;
        float vi = c->beta2 * v[i] + c->one_minus_beta2 * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi * c->bc1, vhat = vi * c->bc2;
        /* decay uses the weight before this step's update, as torch.optim.AdamW does */
        param[i] -= c->lr * (mhat / (sqrtf(vhat) + c->eps) + c->weight_decay * param[i]);
    }
}

#ifdef HOST_ADAMW_X86
/* AVX2 without FMA in the target: the compiler has no fused instruction to contract into. */
__attribute__((target("avx2"))) static void adamw_avx2(const adamw_coef *c, float *param,
                                                       const float *grad, float *m, float *v,
                                                       size_t i0, size_t i1) {
    const __m256 gs = _mm256_set1_ps(c->grad_scale), b1 = _mm256_set1_ps(c->beta1),
                 b2 = _mm256_set1_ps(c->beta2), ob1 = _mm256_set1_ps(c->one_minus_beta1),
                 ob2 = _mm256_set1_ps(c->one_minus_beta2), bc1 = _mm256_set1_ps(c->bc1),
                 bc2 = _mm256_set1_ps(c->bc2), eps = _mm256_set1_ps(c->eps),
                 lr = _mm256_set1_ps(c->lr), wd = _mm256_set1_ps(c->weight_decay);
    size_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gs);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(ob1, g));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                  _mm256_mul_ps(_mm256_mul_ps(ob2, g), g));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        __m256 mhat = _mm256_mul_ps(mi, bc1), vhat = _mm256_mul_ps(vi, bc2);
        __m256 p = _mm256_loadu_ps(param + i);
        __m256 step = _mm256_add_ps(_mm256_div_ps(mhat, _mm256_add_ps(_mm256_sqrt_ps(vhat), eps)),
                                    _mm256_mul_ps(wd, p));
        _mm256_storeu_ps(param + i, _mm256_sub_ps(p, _mm256_mul_ps(lr, step)));
    }
    adamw_scalar(c, param, grad, m, v, i, i1);
}

/* AVX-512F has fused instructions: the file's contraction-off pragma keeps them out. */
__attribute__((target("avx512f"))) static void adamw_avx512(const adamw_coef *c, float *param,
                                                            const float *grad, float *m,
                                                            float *v, size_t i0, size_t i1) {
    const __m512 gs = _mm512_set1_ps(c->grad_scale), b1 = _mm512_set1_ps(c->beta1),
                 b2 = _mm512_set1_ps(c->beta2), ob1 = _mm512_set1_ps(c->one_minus_beta1),
                 ob2 = _mm512_set1_ps(c->one_minus_beta2), bc1 = _mm512_set1_ps(c->bc1),
                 bc2 = _mm512_set1_ps(c->bc2), eps = _mm512_set1_ps(c->eps),
                 lr = _mm512_set1_ps(c->lr), wd = _mm512_set1_ps(c->weight_decay);
    size_t i = i0;
    for (; i + 16 <= i1; i += 16) {
        __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), gs);
        __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(ob1, g));
        __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                  _mm512_mul_ps(_mm512_mul_ps(ob2, g), g));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        __m512 mhat = _mm512_mul_ps(mi, bc1), vhat = _mm512_mul_ps(vi, bc2);
        __m512 p = _mm512_loadu_ps(param + i);
        __m512 step = _mm512_add_ps(_mm512_div_ps(mhat, _mm512_add_ps(_mm512_sqrt_ps(vhat), eps)),
                                    _mm512_mul_ps(wd, p));
        _mm512_storeu_ps(param + i, _mm512_sub_ps(p, _mm512_mul_ps(lr, step)));
    }
    adamw_scalar(c, param, grad, m, v, i, i1);
}
#endif

/* The bf16 copy of [i0, i1): shlm_f32_to_bf16 (bf16.h) element by element, and its AVX2 and
 * AVX-512 twins, which compute the same rule on integer lanes (the same bits). */
static void bf16_scalar(uint16_t *dst, const float *src, size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; i++) dst[i] = shlm_f32_to_bf16(src[i]);
}

#ifdef HOST_ADAMW_X86
__attribute__((target("avx2"))) static void bf16_avx2(uint16_t *dst, const float *src,
                                                      size_t i0, size_t i1) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000),
                  round = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1),
                  quiet = _mm256_set1_epi32(0x0040);
    size_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
        const __m256i hi = _mm256_srli_epi32(u, 16);
        const __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(u, _mm256_add_epi32(round, _mm256_and_si256(hi, one))), 16);
        /* |u| > inf as signed 32-bit integers: both sides are non-negative */
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
        const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
        /* 16-bit halves, each 128-bit lane packed in place, then the lanes' low quads joined */
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_castsi256_si128(packed));
    }
    bf16_scalar(dst, src, i, i1);
}

__attribute__((target("avx512f"))) static void bf16_avx512(uint16_t *dst, const float *src,
                                                           size_t i0, size_t i1) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000),
                  round = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1),
                  quiet = _mm512_set1_epi32(0x0040);
    size_t i = i0;
    for (; i + 16 <= i1; i += 16) {
        const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
        const __m512i hi = _mm512_srli_epi32(u, 16);
        const __m512i rounded = _mm512_srli_epi32(
            _mm512_add_epi32(u, _mm512_add_epi32(round, _mm512_and_si512(hi, one))), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
        const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, quiet));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
    }
    bf16_scalar(dst, src, i, i1);
}
#endif

typedef void (*bf16_kernel)(uint16_t *, const float *, size_t, size_t);

static bf16_kernel bf16_kernel_of(host_adamw_isa isa) {
#ifdef HOST_ADAMW_X86
    if (isa == HOST_ADAMW_AVX512) return bf16_avx512;
    if (isa == HOST_ADAMW_AVX2) return bf16_avx2;
#endif
    return bf16_scalar;
}

typedef void (*adamw_kernel)(const adamw_coef *, float *, const float *, float *, float *,
                             size_t, size_t);

static adamw_kernel kernel_of(host_adamw_isa isa) {
#ifdef HOST_ADAMW_X86
    if (isa == HOST_ADAMW_AVX512) return adamw_avx512;
    if (isa == HOST_ADAMW_AVX2) return adamw_avx2;
#endif
    return adamw_scalar;
}

const char *host_adamw_isa_name(host_adamw_isa isa) {
    static const char *const names[HOST_ADAMW_N] = {"scalar", "avx2", "avx512"};
    return isa >= 0 && isa < HOST_ADAMW_N ? names[isa] : "?";
}

int host_adamw_isa_supported(host_adamw_isa isa) {
    switch (isa) {
    case HOST_ADAMW_SCALAR: return 1;
#ifdef HOST_ADAMW_X86
    case HOST_ADAMW_AVX2: return __builtin_cpu_supports("avx2");
    case HOST_ADAMW_AVX512: return __builtin_cpu_supports("avx512f");
#endif
    default: return 0;
    }
}

host_adamw_isa host_adamw_isa_best(void) {
    static int best = -1; /* the CPU does not change: asked once (a race writes the same) */
    if (best < 0) {
        int b = HOST_ADAMW_SCALAR;
        for (int i = HOST_ADAMW_N - 1; i > HOST_ADAMW_SCALAR && b == HOST_ADAMW_SCALAR; i--)
            if (host_adamw_isa_supported((host_adamw_isa)i)) b = i;
        best = b;
    }
    return (host_adamw_isa)best;
}

void host_adamw_isa_run(host_adamw_isa isa, float *param, const float *grad, float *m, float *v,
                        size_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float grad_scale, int step, uint16_t *copy) {
    if (!host_adamw_isa_supported(isa))
        SHLM_FATAL("adamw: instruction set %s is not supported here", host_adamw_isa_name(isa));
    const adamw_coef c = coef_of(lr, beta1, beta2, eps, weight_decay, grad_scale, step);
    kernel_of(isa)(&c, param, grad, m, v, 0, n);
    if (copy) bf16_kernel_of(isa)(copy, param, 0, n);
}

/* The calling OpenMP thread's run [i0, i1) of n elements: each thread one contiguous run, a
 * multiple of 64 elements (a cache line of each of the arrays) except the last. The
 * elements are independent, so any split gives the same bits. */
static void thread_run(size_t n, size_t *i0, size_t *i1) {
    const size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
    const size_t per = ((n + nt - 1) / nt + 63) / 64 * 64;
    *i0 = t * per < n ? t * per : n;
    *i1 = *i0 + per < n ? *i0 + per : n;
}

/* A thread's run [i0, i1) in blocks small enough to stay in its core's cache between the
 * update and the copy's rounding, which then reads no memory. */
enum { COPY_BLOCK = 4096 };

static void update_run(adamw_kernel k, bf16_kernel b, const adamw_coef *c, float *param,
                       const float *grad, float *m, float *v, uint16_t *copy, size_t i0,
                       size_t i1) {
    if (!copy) {
        k(c, param, grad, m, v, i0, i1);
        return;
    }
    for (size_t j0 = i0; j0 < i1; j0 += COPY_BLOCK) {
        const size_t j1 = j0 + COPY_BLOCK < i1 ? j0 + COPY_BLOCK : i1;
        k(c, param, grad, m, v, j0, j1);
        b(copy, param, j0, j1);
    }
}

void host_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                int step, float *amax, uint16_t *copy) {
    const adamw_coef c = coef_of(lr, beta1, beta2, eps, weight_decay, grad_scale, step);
    const adamw_kernel k = kernel_of(host_adamw_isa_best());
    const bf16_kernel b = bf16_kernel_of(host_adamw_isa_best());
#pragma omp parallel
    {
        size_t i0, i1;
        thread_run(n, &i0, &i1);
        if (i1 > i0) update_run(k, b, &c, param, grad, m, v, copy, i0, i1);
    }
    if (amax) host_abs_max(amax, param, n);
}

void host_bf16_copy(uint16_t *dst, const float *src, size_t n) {
    const bf16_kernel b = bf16_kernel_of(host_adamw_isa_best());
#pragma omp parallel
    {
        size_t i0, i1;
        thread_run(n, &i0, &i1);
        if (i1 > i0) b(dst, src, i0, i1);
    }
}

void host_abs_max(float *amax, const float *p, size_t n) {
    float mx = *amax;
#pragma omp parallel for reduction(max : mx) schedule(static)
    for (size_t i = 0; i < n; i++) mx = fmaxf(mx, fabsf(p[i])); /* NaN ignored */
    *amax = mx;
}
