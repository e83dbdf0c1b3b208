/* Unit test of the shard arithmetic (src/base/shard.c), one process: padding, owned ranges,
 * and tensor/shard overlaps including N not divisible by S, S = 1 and empty overlaps. */
#include <stdio.h>
#include <string.h>

#include "src/base/shard.h"
#include "tests/check.h"

/* The shards of every rank must tile [0, padded) exactly, and the overlaps of every
 * tensor of a unit with every shard must cover each tensor element exactly once: this
 * is what lets the engine scatter a checkpoint into shards and gather it back. */
static void check_tiling(const size_t *sizes, int n_tensors, int S) {
    size_t n = 0;
    for (int i = 0; i < n_tensors; i++) n += sizes[i];
    size_t padded = shard_padded_size(n, S);
    CHECK_EQ(padded % ((size_t)S * SHARD_ALIGN_ELEMS), 0);
    CHECK_EQ(padded >= n, 1);
    CHECK_EQ(padded - n < (size_t)S * SHARD_ALIGN_ELEMS, 1);
    size_t covered[64] = {0};
    size_t next = 0, real = 0;
    for (int r = 0; r < S; r++) {
        size_t b, e;
        shard_range(n, S, r, &b, &e);
        CHECK_EQ(b, next);
        CHECK_EQ(e - b, shard_numel(n, S));
        next = e;
        size_t off = 0;
        for (int i = 0; i < n_tensors; i++) {
            shard_overlap o;
            size_t c = shard_intersect(b, e, off, sizes[i], &o);
            CHECK_EQ(c, o.count);
            if (c) {
                CHECK_EQ(o.flat_offset, off + o.tensor_offset);
                CHECK_EQ(o.flat_offset, b + o.shard_offset);
                CHECK_EQ(o.shard_offset + c <= e - b, 1);
                CHECK_EQ(o.tensor_offset + c <= sizes[i], 1);
            }
            covered[i] += c;
            real += c;
            off += sizes[i];
        }
    }
    CHECK_EQ(next, padded);
    CHECK_EQ(real, n);
    for (int i = 0; i < n_tensors; i++) CHECK_EQ(covered[i], sizes[i]);
}

int main(int argc, char **argv) {
    (void)argc;
    printf("# reproduce: %s\n", argv[0]);

    /* padding: to a multiple of S·8 */
    CHECK_EQ(shard_padded_size(0, 4), 0);
    CHECK_EQ(shard_padded_size(1, 4), 32);
    CHECK_EQ(shard_padded_size(32, 4), 32);
    CHECK_EQ(shard_padded_size(33, 4), 64);
    CHECK_EQ(shard_padded_size(100, 3), 120);   /* N not divisible by S */
    CHECK_EQ(shard_padded_size(17, 1), 24);     /* S = 1 still aligns to 8 */
    CHECK_EQ(shard_padded_size(16, 1), 16);
    CHECK_EQ(shard_numel(100, 3), 40);
    CHECK_EQ(shard_numel(1000, 1), 1000);
    CHECK_EQ(shard_numel(7, 128), 8);            /* tiny unit, huge group: 1 chunk each */

    /* ranges: N = 100, S = 3 -> padded 120, 40 each; the last shard holds 20 real */
    size_t b, e;
    shard_range(100, 3, 0, &b, &e);
    CHECK_EQ(b, 0);
    CHECK_EQ(e, 40);
    shard_range(100, 3, 2, &b, &e);
    CHECK_EQ(b, 80);
    CHECK_EQ(e, 120);
    shard_range(1000, 1, 0, &b, &e);
    CHECK_EQ(b, 0);
    CHECK_EQ(e, 1000);

    /* overlaps */
    shard_overlap o;
    /* tensor [30, 90) against shard [40, 80): fully inside the tensor */
    CHECK_EQ(shard_intersect(40, 80, 30, 60, &o), 40);
    CHECK_EQ(o.flat_offset, 40);
    CHECK_EQ(o.shard_offset, 0);
    CHECK_EQ(o.tensor_offset, 10);
    /* tensor [50, 60) inside shard [40, 80) */
    CHECK_EQ(shard_intersect(40, 80, 50, 10, &o), 10);
    CHECK_EQ(o.shard_offset, 10);
    CHECK_EQ(o.tensor_offset, 0);
    /* tensor [70, 100) straddles the end of shard [40, 80) */
    CHECK_EQ(shard_intersect(40, 80, 70, 30, &o), 10);
    CHECK_EQ(o.flat_offset, 70);
    CHECK_EQ(o.shard_offset, 30);
    CHECK_EQ(o.tensor_offset, 0);
    /* tensor [0, 40) ends exactly where shard [40, 80) begins: empty */
    memset(&o, 0xff, sizeof o);
    CHECK_EQ(shard_intersect(40, 80, 0, 40, &o), 0);
    CHECK_EQ(o.count, 0);
    CHECK_EQ(o.flat_offset, 0);
    CHECK_EQ(o.shard_offset, 0);
    CHECK_EQ(o.tensor_offset, 0);
    /* tensor after the shard, empty tensor, shard entirely in padding */
    CHECK_EQ(shard_intersect(40, 80, 80, 5, &o), 0);
    CHECK_EQ(shard_intersect(40, 80, 50, 0, &o), 0);
    shard_range(7, 4, 3, &b, &e); /* N=7, S=4: padded 32, rank 3 owns [24,32): padding */
    CHECK_EQ(shard_intersect(b, e, 0, 7, &o), 0);

    /* whole units: tensors of uneven sizes tiled over several group sizes */
    const size_t llama_block[] = {64, 192 * 64, 64 * 64, 64, 2 * 172 * 64, 64 * 172};
    const size_t odd[] = {1, 3, 5, 7, 11, 13, 17};
    const size_t one[] = {1};
    int group_sizes[] = {1, 2, 3, 4, 7, 8, 64};
    for (size_t k = 0; k < sizeof group_sizes / sizeof *group_sizes; k++) {
        check_tiling(llama_block, 6, group_sizes[k]);
        check_tiling(odd, 7, group_sizes[k]);
        check_tiling(one, 1, group_sizes[k]);
    }

    return check_exit();
}
