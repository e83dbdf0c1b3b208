/* Random numbers: counter-based (a pure function of seed and index, so any rank can
 * draw exactly its own slice) and a small sequential generator for sampling. */
#ifndef SHLM_RNG_H
#define SHLM_RNG_H

#include <stddef.h>
#include <stdint.h>

/* splitmix64 finaliser: a well-mixed 64-bit hash of x. */
uint64_t rng_hash64(uint64_t x);
/* Uniform in [0,1) from (key, index). */
double rng_uniform_at(uint64_t key, uint64_t index);
/* Standard normal from (key, index), Box-Muller over two counter draws. */
double rng_normal_at(uint64_t key, uint64_t index);

/* A fingerprint of fp32 values x[0, n) that sit at positions first.. of a larger buffer:
 * the sum mod 2^64 of rng_hash64(rng_hash64(position) ^ the value's 32 bits). Sums over
 * consecutive ranges add up to the whole buffer's, so shards are fingerprinted apart. */
uint64_t rng_fingerprint_f32(uint64_t first, const float *x, size_t n);

/* Sequential generator (splitmix64 stepping), state is one word so it
 * can be saved in a checkpoint. */
typedef struct rng_state { uint64_t s; } rng_state;
void rng_seed(rng_state *r, uint64_t seed);
uint64_t rng_next(rng_state *r);
double rng_uniform(rng_state *r); /* [0,1) */

#endif
