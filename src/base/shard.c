/* Shard arithmetic for flat parameter buffers (see shard.h): padding, owned ranges and
 * tensor/shard overlaps, used by the FSDP engine and by checkpoint hyperslabs. */
#include "src/base/shard.h"

size_t shard_padded_size(size_t n, int S) {
    size_t m = (size_t)(S > 0 ? S : 1) * SHARD_ALIGN_ELEMS;
    return (n + m - 1) / m * m;
}

size_t shard_numel(size_t n, int S) {
    return shard_padded_size(n, S) / (size_t)(S > 0 ? S : 1);
}

void shard_range(size_t n, int S, int r, size_t *begin, size_t *end) {
    size_t ns = shard_numel(n, S);
    *begin = (size_t)r * ns;
    *end = *begin + ns;
}

size_t shard_intersect(size_t shard_begin, size_t shard_end, size_t tensor_offset,
                       size_t tensor_numel, shard_overlap *out) {
    size_t lo = shard_begin > tensor_offset ? shard_begin : tensor_offset;
    size_t tensor_end = tensor_offset + tensor_numel;
    size_t hi = shard_end < tensor_end ? shard_end : tensor_end;
    if (hi <= lo) {
        *out = (shard_overlap){0};
        return 0;
    }
    out->count = hi - lo;
    out->flat_offset = lo;
    out->shard_offset = lo - shard_begin;
    out->tensor_offset = lo - tensor_offset;
    return out->count;
}
