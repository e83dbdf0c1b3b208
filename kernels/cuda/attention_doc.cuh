/* cuda backend: the document mask of the attention kernels (ops.h attention_fwd's
 * doc_start: query t of sequence b sees keys doc_start[b·T + t]..t), shared by
 * attention.cu's mma.sync kernels and the Hopper ones so that every kernel visits, skips
 * and masks the same tiles: the dK/dV passes write exactly the dS tiles the dQ passes read.
 *   forward, query tile [q0, ..]: key tiles from doc_first_key(q0) / tile on (the rows'
 *     first keys grow with the row), keys before a row's first key masked element-wise;
 *   dK/dV, key tile [k0, k1]: queries from k0 (causal) to doc_query_end(k1), 64-query
 *     steps from k0 while a step starts before it;
 *   dQ, 64-query dS tile Q: 128-key tiles from doc_first_key(64Q) / 128 on, exactly the
 *     ones whose dK/dV block visited query step Q. */
#pragma once

#include "kernels/cuda/cuda_common.cuh"

/* The first key query t (< T) of sequence b sees: doc_start[b·T + t], clamped to t (ops.h
 * promises at most t; the clamp keeps t's own key, so no row is ever fully masked, and no
 * loop bound leaves its range, whatever the input). */
__device__ __forceinline__ int doc_first_key(const int32_t *doc, int b, int T, int t) {
    return min((int)__ldg(doc + (size_t)b * T + t), t);
}

/* The end of the queries of sequence b that see some key at or before k: the first t > k
 * whose document starts after k, or T (also when k >= T: a key tile's last key may lie
 * past T). doc_start rows are non-decreasing, so it is found
 * by a search: each round the calling warp (all 32 lanes, converged) probes 32 evenly
 * spaced positions of the range left, ⌈log32(T − k)⌉ rounds of one load. Every lane gets
 * the answer. */
__device__ __forceinline__ int doc_query_end(const int32_t *doc, int b, int T, int k) {
    const int32_t *const row = doc + (size_t)b * T;
    const int lane = threadIdx.x & 31;
    /* the answer is in [lo, hi]: row[t] <= k before lo (every t <= k sees k), > k at hi */
    int lo = min(k + 1, T), hi = T;
    while (lo < hi) {
        const int step = (hi - lo + 31) / 32;
        const int p = lo + lane * step;
        const unsigned after = __ballot_sync(0xffffffffu, p < hi && (int)__ldg(row + p) > k);
        if (after == 0) { /* every probe sees k: past the last one */
            lo += (hi - 1 - lo) / step * step + 1;
        } else {          /* between the last probe that sees k and the first that does not */
            const int f = __ffs(after) - 1;
            hi = lo + f * step;
            if (f > 0) lo += (f - 1) * step + 1;
        }
    }
    return lo;
}
