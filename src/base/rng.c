/* Counter-based and sequential random numbers (splitmix64), see rng.h. */
#include "src/base/rng.h"

#include <math.h>
#include <string.h>

uint64_t rng_hash64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static double to_unit(uint64_t x) { return (double)(x >> 11) * (1.0 / 9007199254740992.0); }

double rng_uniform_at(uint64_t key, uint64_t index) {
    return to_unit(rng_hash64(rng_hash64(key) ^ index));
}

double rng_normal_at(uint64_t key, uint64_t index) {
    /* two independent uniforms per index; u1 in (0,1] so log() is finite */
    double u1 = 1.0 - rng_uniform_at(key, 2 * index);
    double u2 = rng_uniform_at(key, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void rng_seed(rng_state *r, uint64_t seed) { r->s = rng_hash64(seed); }

uint64_t rng_next(rng_state *r) {
    r->s += 0x9E3779B97F4A7C15ull;
    uint64_t z = r->s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double rng_uniform(rng_state *r) { return to_unit(rng_next(r)); }

uint64_t rng_fingerprint_f32(uint64_t first, const float *x, size_t n) {
    uint64_t h = 0;
    /* a sum mod 2^64: any split over the threads gives the same value (a 7B base is 6.7e9
     * terms, half a minute on one core) */
#pragma omp parallel for reduction(+ : h) schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        h += rng_hash64(rng_hash64(first + i) ^ bits);
    }
    return h;
}
