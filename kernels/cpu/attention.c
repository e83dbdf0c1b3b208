/* cpu backend causal grouped-query attention over a fused qkv buffer, optionally
 * block-diagonal per document (doc_start): forward keeps the logsumexp of every score row;
 * backward recomputes the probabilities from it. The KV-cache decode attends its new
 * queries to a cache with the forward's own row computation. */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"

/* head_dim-long dot product; the simd reduction lets the compiler split the sum over
 * vector lanes: a fixed order for a given build, so results stay deterministic */
static inline float dot_f32(const float *restrict a, const float *restrict b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void check_heads(const char *what, int nh, int nkv, int hd) {
    if (nh <= 0 || nkv <= 0 || nh % nkv != 0 || hd <= 0)
        SHLM_FATAL("%s: need n_heads %% n_kv_heads == 0 and positive sizes (nh=%d nkv=%d hd=%d)",
                   what, nh, nkv, hd);
}

/* ops.h's contract on doc_start (NULL passes): every row non-decreasing, 0 <= value <= t */
static void check_doc_start(const char *what, const int32_t *doc_start, int B, int T) {
    if (!doc_start) return;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const int32_t v = doc_start[(size_t)b * T + t];
            const int32_t prev = t > 0 ? doc_start[(size_t)b * T + t - 1] : 0;
            if (v < prev || v > t)
                SHLM_FATAL("%s: doc_start[%d·T + %d] = %d is not a document start of token %d "
                           "(need %d <= it <= %d)", what, b, t, (int)v, t, (int)prev, t);
        }
}

/* One query row: o (hd) = softmax over the keys s0..s1 (inclusive) of q·k_s·scale, times
 * v_s, key s at kbase + s·stride and its value at vbase + s·stride; att (s1+1 floats) and
 * acc (hd) are scratch. Returns the row's logsumexp. The forward and the decode both run
 * it, so a decoded token gets the forward's bits for the same q, k, v. */
static inline float attend_row(float *o, float *att, float *acc, const float *q,
                               const float *kbase, const float *vbase, size_t stride, int s0,
                               int s1, int hd, float scale) {
    float mx = -INFINITY;
    for (int s = s0; s <= s1; s++) {
        att[s] = dot_f32(q, kbase + (size_t)s * stride, hd) * scale;
        if (att[s] > mx) mx = att[s];
    }
    double sum = 0.0;
    for (int s = s0; s <= s1; s++) {
        att[s] = expf(att[s] - mx);
        sum += att[s];
    }
    memset(acc, 0, (size_t)hd * sizeof(float));
    for (int s = s0; s <= s1; s++) {
        const float *restrict v = vbase + (size_t)s * stride;
        const float p = att[s];
#pragma omp simd
        for (int d = 0; d < hd; d++) acc[d] += p * v[d];
    }
    const float inv = (float)(1.0 / sum);
    for (int d = 0; d < hd; d++) o[d] = acc[d] * inv;
    return (float)(mx + log(sum));
}

void shlm_cpu_attention_fwd(void *out_, float *lse, const void *qkv_, const int32_t *doc_start,
                            int B, int T, int nh, int nkv, int hd) {
    float *out = out_;
    const float *qkv = qkv_;
    if (B <= 0 || T <= 0) return;
    check_heads("attention_fwd", nh, nkv, hd);
    check_doc_start("attention_fwd", doc_start, B, T);
    const size_t C3 = (size_t)(nh + 2 * nkv) * hd, CO = (size_t)nh * hd;
    const int group = nh / nkv;
    const float scale = (float)(1.0 / sqrt((double)hd));

#pragma omp parallel
    {
        /* one score row and one output accumulator per thread: memory O(T), never the
         * T×T matrix of a (batch, head) */
        float *att = malloc((size_t)T * sizeof(float));
        float *acc = malloc((size_t)hd * sizeof(float));
        SHLM_CHECK_ALLOC(att);
        SHLM_CHECK_ALLOC(acc);
        /* causal rows cost ∝ t: dynamic chunks keep threads balanced; each row is
         * computed whole by one thread, so results do not depend on the schedule */
#pragma omp for collapse(3) schedule(dynamic, 8)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < nh; h++) {
                for (int t = 0; t < T; t++) {
                    const int kvh = h / group;
                    const float *q = qkv + (size_t)(b * T + t) * C3 + (size_t)h * hd;
                    const float *kbase = qkv + (size_t)b * T * C3 + (size_t)(nh + kvh) * hd;
                    const float *vbase = kbase + (size_t)nkv * hd;
                    /* the keys s0..t: t's document up to t */
                    const int s0 = doc_start ? doc_start[(size_t)b * T + t] : 0;
                    float *o = out + (size_t)(b * T + t) * CO + (size_t)h * hd;
                    lse[((size_t)b * nh + h) * T + t] =
                        attend_row(o, att, acc, q, kbase, vbase, C3, s0, t, hd, scale);
                }
            }
        }
        free(acc);
        free(att);
    }
}

void shlm_cpu_attention_bwd(void *dqkv_, const void *dout_, const void *qkv_, const void *out_,
                            const float *lse, const int32_t *doc_start, int B, int T, int nh,
                            int nkv, int hd, const shlm_rope *rope) {
    float *dqkv = dqkv_;
    const float *dout = dout_, *qkv = qkv_, *out = out_;
    if (B <= 0 || T <= 0) return;
    check_heads("attention_bwd", nh, nkv, hd);
    check_doc_start("attention_bwd", doc_start, B, T);
    if (rope && rope->head_dim != hd)
        SHLM_FATAL("attention_bwd: rope's head_dim %d is not hd %d", rope->head_dim, hd);
    const size_t C3 = (size_t)(nh + 2 * nkv) * hd, CO = (size_t)nh * hd;
    const int group = nh / nkv;
    const float scale = (float)(1.0 / sqrt((double)hd));

#pragma omp parallel
    {
        float *dq = malloc((size_t)hd * sizeof(float));
        SHLM_CHECK_ALLOC(dq);
        /* One task per (batch, kv head): it owns that kv head's dk/dv rows and the dq rows
         * of its query heads, so no two threads write the same element and each sum runs
         * in a fixed order (deterministic, no atomics). */
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++) {
            for (int kvh = 0; kvh < nkv; kvh++) {
                const size_t koff = (size_t)(nh + kvh) * hd, voff = koff + (size_t)nkv * hd;
                const float *kbase = qkv + (size_t)b * T * C3 + koff;
                const float *vbase = qkv + (size_t)b * T * C3 + voff;
                float *dkbase = dqkv + (size_t)b * T * C3 + koff;
                float *dvbase = dqkv + (size_t)b * T * C3 + voff;
                /* dqkv is overwritten: clear this task's dk/dv rows, then accumulate */
                for (int s = 0; s < T; s++) {
                    memset(dkbase + (size_t)s * C3, 0, (size_t)hd * sizeof(float));
                    memset(dvbase + (size_t)s * C3, 0, (size_t)hd * sizeof(float));
                }
                for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                    for (int t = 0; t < T; t++) {
                        const size_t row = (size_t)(b * T + t);
                        const float *q = qkv + row * C3 + (size_t)h * hd;
                        const float *dO = dout + row * CO + (size_t)h * hd;
                        const float *O = out + row * CO + (size_t)h * hd;
                        const float L = lse[((size_t)b * nh + h) * T + t];
                        /* D = Σ_s p_s dp_s = dO·O: the softmax Jacobian's row term */
                        const float D = dot_f32(dO, O, hd);
                        memset(dq, 0, (size_t)hd * sizeof(float));
                        const int s0 = doc_start ? doc_start[(size_t)b * T + t] : 0;
                        for (int s = s0; s <= t; s++) {
                            /* restrict: the four rows are distinct slices, which lets the
                             * update loop below vectorise without overlap checks */
                            const float *restrict k = kbase + (size_t)s * C3;
                            const float *restrict v = vbase + (size_t)s * C3;
                            float *restrict dk = dkbase + (size_t)s * C3;
                            float *restrict dv = dvbase + (size_t)s * C3;
                            const float p = expf(dot_f32(q, k, hd) * scale - L);
                            const float dp = dot_f32(dO, v, hd);
                            const float ds = p * (dp - D) * scale;
#pragma omp simd
                            for (int d = 0; d < hd; d++) {
                                dq[d] += ds * k[d];
                                dk[d] += ds * q[d];
                                dv[d] += p * dO[d];
                            }
                        }
                        memcpy(dqkv + row * C3 + (size_t)h * hd, dq, (size_t)hd * sizeof(float));
                    }
                }
            }
        }
        free(dq);
    }
    /* the gradient w.r.t. the pre-RoPE q, k is the inverse rotation of the post-RoPE one:
     * the same separate pass the model would run after the backward */
    if (rope) shlm_cpu_rope(dqkv, B * T, T, (int)C3, nh + nkv, rope, NULL, 1);
}

/* ops.h's contract on a KV cache's lengths: 0 <= pos[b], pos[b] + Tn <= cap */
static void check_cache(const char *what, const int32_t *pos, int B, int Tn, int cap) {
    for (int b = 0; b < B; b++)
        if (pos[b] < 0 || pos[b] > cap - Tn)
            SHLM_FATAL("%s: row %d holds %d tokens; %d more do not fit its cache of %d (need "
                       "0 <= pos[b] <= %d)", what, b, (int)pos[b], Tn, cap, cap - Tn);
}

static void append(float *kc, float *vc, const float *qkv, const int32_t *pos, int B, int Tn,
                   int cap, int nh, int nkv, int hd) {
    const size_t C3 = (size_t)(nh + 2 * nkv) * hd;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tn; t++) {
            const float *row = qkv + (size_t)(b * Tn + t) * C3;
            for (int kh = 0; kh < nkv; kh++) {
                const size_t at = (((size_t)b * nkv + kh) * cap + (size_t)(pos[b] + t)) * hd;
                memcpy(kc + at, row + (size_t)(nh + kh) * hd, (size_t)hd * sizeof(float));
                memcpy(vc + at, row + (size_t)(nh + nkv + kh) * hd, (size_t)hd * sizeof(float));
            }
        }
}

void shlm_cpu_kv_append(void *k_cache, void *v_cache, const void *qkv, const int32_t *pos, int B,
                        int Tn, int cap, int nh, int nkv, int hd) {
    if (B <= 0 || Tn <= 0) return;
    check_heads("kv_append", nh, nkv, hd);
    check_cache("kv_append", pos, B, Tn, cap);
    append(k_cache, v_cache, qkv, pos, B, Tn, cap, nh, nkv, hd);
}

void shlm_cpu_attention_decode(void *out_, void *k_cache, void *v_cache, const void *qkv_,
                               const int32_t *pos, int B, int Tn, int cap, int nh, int nkv,
                               int hd) {
    float *out = out_, *kc = k_cache, *vc = v_cache;
    const float *qkv = qkv_;
    if (B <= 0 || Tn <= 0) return;
    check_heads("attention_decode", nh, nkv, hd);
    check_cache("attention_decode", pos, B, Tn, cap);
    append(kc, vc, qkv, pos, B, Tn, cap, nh, nkv, hd);
    const size_t C3 = (size_t)(nh + 2 * nkv) * hd, CO = (size_t)nh * hd;
    const int group = nh / nkv;
    const float scale = (float)(1.0 / sqrt((double)hd));

#pragma omp parallel
    {
        float *att = malloc((size_t)cap * sizeof(float));
        float *acc = malloc((size_t)hd * sizeof(float));
        SHLM_CHECK_ALLOC(att);
        SHLM_CHECK_ALLOC(acc);
        /* as the forward: one row per (b, h, t), whole in one thread */
#pragma omp for collapse(3) schedule(dynamic, 8)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < nh; h++) {
                for (int t = 0; t < Tn; t++) {
                    const size_t head = (size_t)b * nkv + (size_t)(h / group);
                    const float *kbase = kc + head * cap * hd, *vbase = vc + head * cap * hd;
                    const float *q = qkv + (size_t)(b * Tn + t) * C3 + (size_t)h * hd;
                    float *o = out + (size_t)(b * Tn + t) * CO + (size_t)h * hd;
                    attend_row(o, att, acc, q, kbase, vbase, (size_t)hd, 0, pos[b] + t, hd,
                               scale);
                }
            }
        }
        free(acc);
        free(att);
    }
}
