/* Unit test of the shard arithmetic (src/base/shard.c), one process: padding, owned ranges,
 * and tensor/shard overlaps including N not divisible by S, S = 1 and empty overlaps. */
#include <stdio.h>
#include <string.h>

#include "src/base/shard.h"

static int failures = 0;

#define EXPECT_EQ(a, b)                                                                   \
    do {                                                                                  \
        size_t a_ = (size_t)(a), b_ = (size_t)(b);                                        \
        if (a_ != b_) {                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s = %zu, expected %s = %zu\n", __FILE__,         \
                    __LINE__, #a, a_, #b, b_);                                            \
            failures++;                                                                   \
        }                                                                                 \
    } while (0)

/* The shards of every rank must tile [0, padded) exactly, and the overlaps of every
 * tensor of a unit with every shard must cover each tensor element exactly once: this
 * is what lets the engine scatter a checkpoint into shards and gather it back. */
static void check_tiling(const size_t *sizes, int n_tensors, int S) {
    size_t n = 0;
    for (int i = 0; i < n_tensors; i++) n += sizes[i];
    size_t padded = shard_padded_size(n, S);
    EXPECT_EQ(padded % ((size_t)S * SHARD_ALIGN_ELEMS), 0);
    EXPECT_EQ(padded >= n, 1);
    EXPECT_EQ(padded - n < (size_t)S * SHARD_ALIGN_ELEMS, 1);
    size_t covered[64] = {0};
    size_t next = 0, real = 0;
    for (int r = 0; r < S; r++) {
        size_t b, e;
        shard_range(n, S, r, &b, &e);
        EXPECT_EQ(b, next);
        EXPECT_EQ(e - b, shard_numel(n, S));
        next = e;
        size_t off = 0;
        for (int i = 0; i < n_tensors; i++) {
            shard_overlap o;
            size_t c = shard_intersect(b, e, off, sizes[i], &o);
            EXPECT_EQ(c, o.count);
            if (c) {
                EXPECT_EQ(o.flat_offset, off + o.tensor_offset);
                EXPECT_EQ(o.flat_offset, b + o.shard_offset);
                EXPECT_EQ(o.shard_offset + c <= e - b, 1);
                EXPECT_EQ(o.tensor_offset + c <= sizes[i], 1);
            }
            covered[i] += c;
            real += c;
            off += sizes[i];
        }
    }
    EXPECT_EQ(next, padded);
    EXPECT_EQ(real, n);
    for (int i = 0; i < n_tensors; i++) EXPECT_EQ(covered[i], sizes[i]);
}

int main(int argc, char **argv) {
    (void)argc;
    printf("# reproduce: %s\n", argv[0]);

    /* padding: to a multiple of S·8 */
    EXPECT_EQ(shard_padded_size(0, 4), 0);
    EXPECT_EQ(shard_padded_size(1, 4), 32);
    EXPECT_EQ(shard_padded_size(32, 4), 32);
    EXPECT_EQ(shard_padded_size(33, 4), 64);
    EXPECT_EQ(shard_padded_size(100, 3), 120);   /* N not divisible by S */
    EXPECT_EQ(shard_padded_size(17, 1), 24);     /* S = 1 still aligns to 8 */
    EXPECT_EQ(shard_padded_size(16, 1), 16);
    EXPECT_EQ(shard_numel(100, 3), 40);
    EXPECT_EQ(shard_numel(1000, 1), 1000);
    EXPECT_EQ(shard_numel(7, 128), 8);            /* tiny unit, huge group: 1 chunk each */

    /* ranges: N = 100, S = 3 -> padded 120, 40 each; the last shard holds 20 real */
    size_t b, e;
    shard_range(100, 3, 0, &b, &e);
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 40);
    shard_range(100, 3, 2, &b, &e);
    EXPECT_EQ(b, 80);
    EXPECT_EQ(e, 120);
    shard_range(1000, 1, 0, &b, &e);
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 1000);

    /* overlaps */
    shard_overlap o;
    /* tensor [30, 90) against shard [40, 80): fully inside the tensor */
    EXPECT_EQ(shard_intersect(40, 80, 30, 60, &o), 40);
    EXPECT_EQ(o.flat_offset, 40);
    EXPECT_EQ(o.shard_offset, 0);
    EXPECT_EQ(o.tensor_offset, 10);
    /* tensor [50, 60) inside shard [40, 80) */
    EXPECT_EQ(shard_intersect(40, 80, 50, 10, &o), 10);
    EXPECT_EQ(o.shard_offset, 10);
    EXPECT_EQ(o.tensor_offset, 0);
    /* tensor [70, 100) straddles the end of shard [40, 80) */
    EXPECT_EQ(shard_intersect(40, 80, 70, 30, &o), 10);
    EXPECT_EQ(o.flat_offset, 70);
    EXPECT_EQ(o.shard_offset, 30);
    EXPECT_EQ(o.tensor_offset, 0);
    /* tensor [0, 40) ends exactly where shard [40, 80) begins: empty */
    memset(&o, 0xff, sizeof o);
    EXPECT_EQ(shard_intersect(40, 80, 0, 40, &o), 0);
    EXPECT_EQ(o.count, 0);
    EXPECT_EQ(o.flat_offset, 0);
    EXPECT_EQ(o.shard_offset, 0);
    EXPECT_EQ(o.tensor_offset, 0);
    /* tensor after the shard, empty tensor, shard entirely in padding */
    EXPECT_EQ(shard_intersect(40, 80, 80, 5, &o), 0);
    EXPECT_EQ(shard_intersect(40, 80, 50, 0, &o), 0);
    shard_range(7, 4, 3, &b, &e); /* N=7, S=4: padded 32, rank 3 owns [24,32): padding */
    EXPECT_EQ(shard_intersect(b, e, 0, 7, &o), 0);

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

    if (failures) {
        printf("test_shard: FAIL (%d check(s))\n", failures);
        return 1;
    }
    printf("test_shard: PASS\n");
    return 0;
}
