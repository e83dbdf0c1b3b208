/* The host AdamW (kernels/host_adamw.h): every instruction set this CPU runs, and the
 * threaded entry point, against the scalar reference below (the cpu backend's AdamW loop as
 * it was written before the host AdamW took it over), bit for bit, on lengths that leave
 * every kind of tail (1..SIMD width+1, odd, a multiple plus one), several steps in a row
 * with and without weight decay, clipping's grad_scale and values spanning magnitudes; the
 * bf16 copy written beside the update (the optimizer offload's) against shlm_f32_to_bf16,
 * and on the values where rounding is delicate (ties, the top of the range, NaN, inf). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off") /* the reference rounds every product */
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/host_adamw.h"
#include "src/base/rng.h"
#include "tests/check.h"

static void reference(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                      int step) {
    const float bc1 = (float)(1.0 / (1.0 - pow((double)beta1, step)));
    const float bc2 = (float)(1.0 / (1.0 - pow((double)beta2, step)));
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi * bc1, vhat = vi * bc2;
        param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * param[i]);
    }
}

/* a value of magnitude 2^-20 .. 2^4, either sign, from (seed, i) */
static float value(uint64_t seed, size_t i) {
    const uint64_t h = rng_hash64(seed * 0x9e3779b97f4a7c15ull + i);
    const double u = (double)(h >> 11) / 9007199254740992.0;
    const int e = (int)(h & 31) % 25 - 20;
    return (float)((h & 32 ? -1 : 1) * ldexp(0.5 + u, e));
}

typedef struct state {
    float *p, *g, *m, *v;
} state;

static state make(size_t n, uint64_t seed) {
    state s = {malloc(n * 4), malloc(n * 4), malloc(n * 4), malloc(n * 4)};
    for (size_t i = 0; i < n; i++) {
        s.p[i] = value(seed, i);
        s.m[i] = 0.1f * value(seed + 1, i);
        s.v[i] = fabsf(0.01f * value(seed + 2, i));
    }
    return s;
}

static void drop(state *s) {
    free(s->p), free(s->g), free(s->m), free(s->v);
}

static int same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * 4) == 0; }

/* `steps` steps on a copy each: isa (or HOST_ADAMW_N: host_adamw, threaded) vs the
 * reference; returns whether every buffer matched after every step */
static int agrees(int isa, size_t n, int steps, float wd, float grad_scale, uint64_t seed) {
    state ref = make(n, seed), got = make(n, seed);
    uint16_t *copy = malloc(n * sizeof *copy);
    int ok = 1;
    for (int t = 1; t <= steps && ok; t++) {
        for (size_t i = 0; i < n; i++) ref.g[i] = got.g[i] = value(seed + 10 + (uint64_t)t, i);
        reference(ref.p, ref.g, ref.m, ref.v, n, 3e-3f, 0.9f, 0.95f, 1e-8f, wd, grad_scale, t);
        uint16_t *c = t % 2 ? copy : NULL; /* with and without the copy */
        if (isa == HOST_ADAMW_N)
            host_adamw(got.p, got.g, got.m, got.v, n, 3e-3f, 0.9f, 0.95f, 1e-8f, wd, grad_scale,
                       t, NULL, c);
        else
            host_adamw_isa_run((host_adamw_isa)isa, got.p, got.g, got.m, got.v, n, 3e-3f, 0.9f,
                               0.95f, 1e-8f, wd, grad_scale, t, c);
        ok = same(ref.p, got.p, n) && same(ref.m, got.m, n) && same(ref.v, got.v, n);
        for (size_t i = 0; c && i < n && ok; i++) ok = c[i] == shlm_f32_to_bf16(ref.p[i]);
    }
    free(copy);
    drop(&ref);
    drop(&got);
    return ok;
}

int main(void) {
    static const size_t lengths[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 127, 1001,
                                     4099, 100003};
    const size_t n_lengths = sizeof lengths / sizeof lengths[0];
    for (int isa = 0; isa <= HOST_ADAMW_N; isa++) {
        const char *name = isa == HOST_ADAMW_N ? "host_adamw (threaded, widest)"
                                               : host_adamw_isa_name((host_adamw_isa)isa);
        if (isa < HOST_ADAMW_N && !host_adamw_isa_supported((host_adamw_isa)isa)) {
            printf("# %s: not run by this CPU\n", name);
            continue;
        }
        int ok = 1;
        for (size_t k = 0; k < n_lengths; k++)
            for (int variant = 0; variant < 2; variant++) {
                const float wd = variant ? 0.1f : 0.0f, gs = variant ? 0.37f : 1.0f;
                ok &= CHECK(agrees(isa, lengths[k], 4, wd, gs, 1000 + k),
                            "%s, n %zu, weight decay %g, grad_scale %g", name, lengths[k], wd, gs);
            }
        check(ok, "%s equals the scalar reference bit for bit on %zu lengths, 4 steps", name,
              n_lengths);
    }
    printf("# widest instruction set here: %s\n", host_adamw_isa_name(host_adamw_isa_best()));

    /* the copy's rounding where it is delicate: ties to even both ways, the largest finite
     * values (rounding up to inf), subnormals, zeros, inf and NaNs (a payload that truncation
     * would turn into inf); for each instruction set through an update that leaves finite
     * weights as they are (lr 0, no decay, zero moments), then NaN and inf through the
     * threaded copy alone */
    {
        uint32_t bits[] = {0x3F808000u, 0x3F818000u, 0x3F807FFFu, 0x3F808001u, 0x7F7FFFFFu,
                           0xFF7F8000u, 0x7F7F7FFFu, 0x00000001u, 0x80008000u, 0x00018000u,
                           0x00000000u, 0x80000000u, 0x3F800000u, 0xC0490FDBu, 0x477FE000u,
                           0x33800000u, 0x7F800000u, 0xFF800000u, 0x7F800001u, 0xFFC00000u,
                           0x7FBFFFFFu, 0x7F80FFFFu};
        enum { N_FINITE = 16, N_BITS = sizeof bits / sizeof bits[0], N = 3 * N_BITS + 5 };
        float x[N], zero[N], m[N], v[N], p[N];
        uint16_t got[N], want[N];
        for (int i = 0; i < N; i++) {
            const uint32_t b = bits[i % N_BITS];
            memcpy(&x[i], &b, 4);
            zero[i] = 0.0f;
            want[i] = shlm_f32_to_bf16(x[i]);
        }
        for (int isa = 0; isa < HOST_ADAMW_N; isa++) {
            if (!host_adamw_isa_supported((host_adamw_isa)isa)) continue;
            int ok = 1;
            for (int n = 1; n <= N; n++) {
                int k = 0;
                for (int i = 0; i < N; i++)
                    if (i % N_BITS < N_FINITE) p[k++] = x[i];
                const int nf = k < n ? k : n;
                memset(m, 0, sizeof m);
                memset(v, 0, sizeof v);
                host_adamw_isa_run((host_adamw_isa)isa, p, zero, m, v, (size_t)nf, 0.0f, 0.9f,
                                   0.95f, 1e-8f, 0.0f, 1.0f, 1, got);
                for (int i = 0; i < nf; i++) ok &= got[i] == shlm_f32_to_bf16(p[i]);
            }
            check(ok, "%s: the copy of ties, range ends and subnormals is shlm_f32_to_bf16's",
                  host_adamw_isa_name((host_adamw_isa)isa));
        }
        host_bf16_copy(got, x, N);
        check(!memcmp(got, want, sizeof want), "host_bf16_copy equals shlm_f32_to_bf16 on %d "
              "values, inf and NaN among them", (int)N);
        check(want[16] == 0x7F80u && want[18] == 0x7FC0u && want[4] == 0x7F80u,
              "the rule itself: inf stays inf, a NaN stays a NaN, the top rounds to inf");
    }

    /* the amax over the updated weights */
    state s = make(1001, 7);
    for (size_t i = 0; i < 1001; i++) s.g[i] = value(8, i);
    s.p[500] = -40.0f;
    float amax = 0.0f;
    host_adamw(s.p, s.g, s.m, s.v, 1001, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1, &amax, NULL);
    float want = 0.0f;
    for (size_t i = 0; i < 1001; i++) want = fmaxf(want, fabsf(s.p[i]));
    check(amax == want && amax > 39.0f, "amax is the largest |weight| after the update (%g)",
          (double)amax);
    drop(&s);
    return check_exit();
}
