/* The dropout mask of ops->dropout (kernels/ops.h), one definition for every backend: a
 * pure function of (row key, salt, element index), so a mask is the same on the cpu and
 * the GPU, in the forward and the backward, and at every world size. */
#ifndef SHLM_DROPOUT_MASK_H
#define SHLM_DROPOUT_MASK_H

#include <stdint.h>

#ifdef __CUDACC__
#define SHLM_HOST_DEVICE __host__ __device__
#else
#define SHLM_HOST_DEVICE
#endif

/* splitmix64's finaliser (src/base/rng.h rng_hash64) */
static inline SHLM_HOST_DEVICE uint64_t shlm_dropout_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The threshold of probability p: a 24-bit draw below it is dropped. */
static inline SHLM_HOST_DEVICE uint32_t shlm_dropout_threshold(float p) {
    return (uint32_t)((double)p * 16777216.0);
}

/* Whether element idx of the sequence with key row_key is kept: its 24-bit draw
 * (the top bits of mix(mix(row_key ^ salt) ^ idx)) is at least the threshold. */
static inline SHLM_HOST_DEVICE int shlm_dropout_keep(uint64_t row_key, uint64_t salt,
                                                     uint64_t idx, uint32_t threshold) {
    return (uint32_t)(shlm_dropout_mix(shlm_dropout_mix(row_key ^ salt) ^ idx) >> 40) >= threshold;
}

#endif
