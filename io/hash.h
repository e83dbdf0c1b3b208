/* FNV-1a, 64 bits: a cheap identity for texts and files (is this the same job, the same
 * token file?), not a checksum against damage (io/ckpt_hdf5.h has that). */
#ifndef SHLM_HASH_H
#define SHLM_HASH_H

#include <stddef.h>
#include <stdint.h>

#define SHLM_FNV1A64_BASIS 0xcbf29ce484222325ull

/* h extended by the n bytes at p (start with SHLM_FNV1A64_BASIS). */
static inline uint64_t shlm_fnv1a64(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull; /* the FNV prime */
    }
    return h;
}

#endif
