/* Shard arithmetic for flat parameter buffers: padding a unit for a shard group, the
 * range a rank owns, and where a tensor and a shard overlap. Pure functions. */
#ifndef SHLM_SHARD_H
#define SHLM_SHARD_H

#include <stddef.h>

/* Each rank's shard is a multiple of this many elements, so every shard starts 16-byte
 * aligned in bf16 and 32-byte aligned in fp32 (relative to the aligned unit buffer):
 * NCCL and vectorised kernels (float4, 8×bf16 loads) take their fast paths only on
 * 16-byte aligned slices. It costs at most S·8-1 elements of padding per unit. */
enum { SHARD_ALIGN_ELEMS = 8 };

/* N rounded up to a multiple of S·SHARD_ALIGN_ELEMS: the length of a unit's flat
 * buffer of N elements sharded over S ranks (S >= 1). shard_padded_size(0, S) = 0. */
size_t shard_padded_size(size_t n, int S);

/* Elements each rank owns of a unit of N elements: shard_padded_size(n, S) / S. */
size_t shard_numel(size_t n, int S);

/* Rank r's range [*begin, *end) of the padded flat buffer of a unit of N elements:
 * [r·n_s, (r+1)·n_s) with n_s = shard_numel(n, S). Part of it (or all, on the last
 * ranks of a small unit) may be padding beyond N. */
void shard_range(size_t n, int S, int r, size_t *begin, size_t *end);

/* Where a shard [shard_begin, shard_end) and a tensor stored at
 * [tensor_offset, tensor_offset + tensor_numel) of the same flat buffer overlap. */
typedef struct shard_overlap {
    size_t count;        /* elements in common; 0 = no overlap (other fields then 0) */
    size_t flat_offset;  /* start of the overlap in the flat buffer */
    size_t shard_offset; /* ... relative to shard_begin (index into the rank's shard) */
    size_t tensor_offset;/* ... relative to tensor_offset (index into the tensor) */
} shard_overlap;

/* Fills *out and returns out->count. */
size_t shard_intersect(size_t shard_begin, size_t shard_end, size_t tensor_offset,
                       size_t tensor_numel, shard_overlap *out);

#endif
