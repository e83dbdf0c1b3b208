/* Test of the checkpoint file layer (io/ckpt_hdf5.c) on any number of ranks: the flat
 * range -> hyperslab blocks, the checksum's properties, collective range I/O, attributes,
 * exclusive creation. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "io/ckpt_hdf5.h"
#include "tests/check.h"

static int rank = 0, world = 1;

/* ---- blocks: every element of the range exactly once, in row-major order ---- */
static void check_blocks(int ndim, int64_t rows, int64_t cols, uint64_t first, uint64_t count) {
    int64_t shape[2] = {rows, cols};
    uint64_t start[3][2], block[3][2];
    int n = ckpt_h5_range_blocks(ndim, shape, first, count, start, block);
    uint64_t next = first, total = 0;
    const uint64_t C = ndim == 2 ? (uint64_t)cols : 1;
    for (int b = 0; b < n; b++) {
        if (ndim == 1) {
            CHECK(start[b][0] == next, "1-D block %d starts at %llu, want %llu", b,
                  (unsigned long long)start[b][0], (unsigned long long)next);
            next += block[b][0];
            total += block[b][0];
            continue;
        }
        CHECK(block[b][0] >= 1 && block[b][1] >= 1, "empty block");
        /* a block is rectangular; row-major order over the blocks must be contiguous */
        for (uint64_t r = 0; r < block[b][0]; r++) {
            uint64_t flat = (start[b][0] + r) * C + start[b][1];
            CHECK(flat == next, "block %d row %llu starts at %llu, want %llu (shape %lldx%lld, "
                  "range %llu+%llu)", b, (unsigned long long)r, (unsigned long long)flat,
                  (unsigned long long)next, (long long)rows, (long long)cols,
                  (unsigned long long)first, (unsigned long long)count);
            next += block[b][1];
            total += block[b][1];
            if (r + 1 < block[b][0]) CHECK(block[b][1] == C, "multi-row block not full rows");
        }
        CHECK(start[b][1] + block[b][1] <= C, "block past the row end");
    }
    CHECK(total == count, "blocks cover %llu of %llu", (unsigned long long)total,
          (unsigned long long)count);
    CHECK(n <= 3, "%d blocks", n);
}

static void test_blocks(void) {
    for (int64_t rows = 1; rows <= 5; rows++)
        for (int64_t cols = 1; cols <= 6; cols++) {
            uint64_t n = (uint64_t)(rows * cols);
            for (uint64_t a = 0; a <= n; a++)
                for (uint64_t c = 0; a + c <= n; c++) {
                    check_blocks(2, rows, cols, a, c);
                    check_blocks(1, (int64_t)n, 0, a, c);
                }
        }
}

/* ---- checksum ---- */
static void test_checksum(void) {
    enum { N = 1000 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = sinf((float)i) * 3.0f;
    ckpt_h5_sum whole = {0, 0};
    ckpt_h5_sum_add(&whole, x, 0, N);
    const uint64_t ref = ckpt_h5_sum_final(&whole, N);
    /* additive over any split, in any order: what makes it world-size independent */
    for (int cut = 0; cut <= N; cut += 37) {
        ckpt_h5_sum s = {0, 0};
        ckpt_h5_sum_add(&s, x + cut, cut, N - cut);
        ckpt_h5_sum_add(&s, x, 0, cut);
        CHECK(ckpt_h5_sum_final(&s, N) == ref, "split at %d differs", cut);
    }
    /* every single flipped bit, anywhere, changes it */
    for (int i = 0; i < N; i += 7) {
        for (int bit = 0; bit < 32; bit += 5) {
            float y[N];
            memcpy(y, x, sizeof y);
            uint32_t w;
            memcpy(&w, &y[i], 4);
            w ^= 1u << bit;
            memcpy(&y[i], &w, 4);
            ckpt_h5_sum s = {0, 0};
            ckpt_h5_sum_add(&s, y, 0, N);
            CHECK(ckpt_h5_sum_final(&s, N) != ref, "flip of bit %d of element %d not seen", bit, i);
        }
    }
    /* moved elements change it, and so does the length */
    float y[N];
    memcpy(y, x, sizeof y);
    y[3] = x[500], y[500] = x[3];
    ckpt_h5_sum s = {0, 0};
    ckpt_h5_sum_add(&s, y, 0, N);
    CHECK(ckpt_h5_sum_final(&s, N) != ref, "swap not seen");
    CHECK(ckpt_h5_sum_final(&whole, N + 1) != ref, "length not in the checksum");
    /* the documented formula, by hand: [1.0f, -2.0f, 0.5f] */
    const float v[3] = {1.0f, -2.0f, 0.5f};
    const uint64_t w0 = 0x3f800000u, w1 = 0xc0000000u, w2 = 0x3f000000u;
    uint64_t s1 = w0 + w1 + w2, s2 = 0 * w0 + 1 * w1 + 2 * w2;
    ckpt_h5_sum t = {0, 0};
    ckpt_h5_sum_add(&t, v, 0, 3);
    CHECK(t.s1 == s1 && t.s2 == s2, "partial sums");
    CHECK(ckpt_h5_sum_final(&t, 3) == ckpt_h5_mix(s1 ^ ckpt_h5_mix(s2 + 3)), "final formula");
    /* the splitmix64 finaliser's published first output for seed 0 */
    CHECK(ckpt_h5_mix(0) == 0xE220A8397B1DCDAFull, "mix(0) = %016llx",
          (unsigned long long)ckpt_h5_mix(0));
}

/* ---- collective I/O of ragged ranges, attributes, errors ---- */
static void test_file(const char *dir) {
    char path[1024], err[1536] = "";
    snprintf(path, sizeof path, "%s/t.h5", dir);
    ckpt_h5_options opt;
    ckpt_h5_default_options(&opt);
    /* mode 0: independent MPI-IO, 1: collective MPI-IO, 2: direct I/O (O_DIRECT) */
    for (int mode = 0; mode <= 2; mode++) {
        opt.collective_io = mode == 1;
        opt.direct_io = mode == 2;
        opt.alignment = mode ? 4096 : 0; /* both layouts */
        opt.align_threshold = 64;
        ckpt_h5_file f;
        if (rank == 0) unlink(path); /* creation is exclusive (test_exclusive) */
        MPI_Barrier(MPI_COMM_WORLD);
        CHECK(ckpt_h5_create(&f, path, MPI_COMM_WORLD, &opt, err, sizeof err) == 0, "%s", err);
        if (rank == 0) printf("mode %d: %s\n", mode, f.io_mode);
        /* a big one: 1000 x 37 (148 kB), ragged ranges at odd offsets, so that direct
         * I/O has aligned middles and unaligned ends on every rank */
        ckpt_h5_dataset db;
        const int64_t sb[2] = {1000, 37};
        const uint64_t nb = 37000;
        float *big = malloc(nb * sizeof(float));
        for (uint64_t i = 0; i < nb; i++) big[i] = (float)i * 0.5f - 7.0f;
        CHECK(ckpt_h5_create_dataset(&f, "/big", 2, sb, &db, err, sizeof err) == 0, "%s", err);
        uint64_t ba = rank == 0 ? 0 : nb * (uint64_t)rank / (uint64_t)world + 3;
        uint64_t bb = rank + 1 == world ? nb : nb * (uint64_t)(rank + 1) / (uint64_t)world + 3;
        CHECK(ckpt_h5_create_group(&f, "/a/b", err, sizeof err) == 0, "%s", err);
        ckpt_h5_dataset d2, d1;
        const int64_t s2[2] = {7, 5}, s1[1] = {13};
        CHECK(ckpt_h5_create_dataset(&f, "/a/b/m.weight", 2, s2, &d2, err, sizeof err) == 0, "%s", err);
        CHECK(ckpt_h5_create_dataset(&f, "/a/v", 1, s1, &d1, err, sizeof err) == 0, "%s", err);
        /* rank r writes a ragged slice (rank 0 of 2+ ranks writes nothing of d1) */
        float vals[35];
        for (int i = 0; i < 35; i++) vals[i] = (float)i + 0.25f;
        uint64_t a = 35u * (uint64_t)rank / (uint64_t)world + (rank ? 1 : 0);
        uint64_t b = 35u * (uint64_t)(rank + 1) / (uint64_t)world + (rank + 1 < world ? 1 : 0);
        if (a > 35) a = 35;
        if (b > 35) b = 35;
        /* ranks 1.. start one element late and their left neighbours end one late */
        CHECK(ckpt_h5_write_range(&f, &d2, a, b - a, vals + a, err, sizeof err) == 0, "%s", err);
        uint64_t a1 = world > 1 && rank == 0 ? 0 : 13u * (uint64_t)rank / (uint64_t)world;
        uint64_t c1 = world > 1 && rank == 0 ? 0 : 13u * (uint64_t)(rank + 1) / (uint64_t)world - a1;
        if (world > 1 && rank == 1) a1 = 0, c1 = 13u * 2 / (uint64_t)world;
        CHECK(ckpt_h5_write_range(&f, &d1, a1, c1, vals + a1, err, sizeof err) == 0, "%s", err);
        CHECK(ckpt_h5_write_range(&f, &d1, 10, 4, vals, err, sizeof err) != 0 &&
                  strstr(err, "outside"), "out-of-range write accepted: %s", err);
        CHECK(ckpt_h5_write_range(&f, &db, ba, bb - ba, big + ba, err, sizeof err) == 0, "%s", err);
        ckpt_h5_close_dataset(&db);
        CHECK(ckpt_h5_attr_write_i64(&f, "/", "i", -5, err, sizeof err) == 0, "%s", err);
        CHECK(ckpt_h5_attr_write_u64(&f, "/a/b/m.weight", "checksum", 1, err, sizeof err) == 0, "%s", err);
        CHECK(ckpt_h5_attr_write_u64(&f, "/a/b/m.weight", "checksum", 0xfedcba9876543210ull, err,
                                     sizeof err) == 0, "%s", err);
        CHECK(ckpt_h5_attr_write_f64(&f, "/", "x", 0.1, err, sizeof err) == 0, "%s", err);
        /* a long string: attributes over 64 KiB need the v1.8 format */
        const size_t text_len = 100000;
        char *text = malloc(text_len + 1);
        for (size_t i = 0; i < text_len; i++) text[i] = (char)('a' + i % 26);
        text[text_len] = '\0';
        CHECK(ckpt_h5_attr_write_str(&f, "/", "job_text", text, err, sizeof err) == 0, "%s", err);
        CHECK(ckpt_h5_attr_write_str(&f, "/", "s", "", err, sizeof err) == 0, "%s", err);
        CHECK(ckpt_h5_flush(&f, err, sizeof err) == 0, "%s", err);
        ckpt_h5_close_dataset(&d2);
        ckpt_h5_close_dataset(&d1);
        CHECK(ckpt_h5_close(&f, err, sizeof err) == 0, "%s", err);

        /* read back: every rank a different range, including none; through H5Dread
         * after modes 0 and 1, directly after mode 2 */
        CHECK(ckpt_h5_open(&f, path, MPI_COMM_WORLD, &opt, err, sizeof err) == 0, "%s", err);
        if (rank == 0) printf("mode %d: reading with %s\n", mode, f.io_mode);
        CHECK(ckpt_h5_open_dataset(&f, "/a/b/m.weight", &d2, err, sizeof err) == 0, "%s", err);
        CHECK(d2.ndim == 2 && d2.shape[0] == 7 && d2.shape[1] == 5 && d2.numel == 35, "shape");
        for (uint64_t first = 0; first <= 35; first += 3) {
            uint64_t cnt = (first * 7 + (uint64_t)rank * 5) % (36 - first);
            float got[35];
            CHECK(ckpt_h5_read_range(&f, &d2, first, cnt, got, err, sizeof err) == 0, "%s", err);
            for (uint64_t i = 0; i < cnt; i++)
                CHECK(got[i] == vals[first + i], "m.weight[%llu] = %g", (unsigned long long)(first + i),
                      got[i]);
        }
        CHECK(ckpt_h5_open_dataset(&f, "/big", &db, err, sizeof err) == 0, "%s", err);
        float *gb = malloc(nb * sizeof(float));
        CHECK(ckpt_h5_read_range(&f, &db, 0, nb, gb, err, sizeof err) == 0, "%s", err);
        CHECK(memcmp(gb, big, nb * sizeof(float)) == 0, "mode %d: /big differs", mode);
        free(gb);
        free(big);
        ckpt_h5_close_dataset(&db);
        CHECK(ckpt_h5_open_dataset(&f, "/a/v", &d1, err, sizeof err) == 0, "%s", err);
        float got1[13];
        CHECK(ckpt_h5_read_range(&f, &d1, 0, 13, got1, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < 13; i++) CHECK(got1[i] == vals[i], "v[%d] = %g", i, got1[i]);
        int64_t i64;
        uint64_t u64;
        double f64;
        char *s = NULL;
        CHECK(ckpt_h5_attr_read_i64(&f, "/", "i", &i64, err, sizeof err) == 0 && i64 == -5, "i");
        CHECK(ckpt_h5_attr_read_u64(&f, "/a/b/m.weight", "checksum", &u64, err, sizeof err) == 0 &&
                  u64 == 0xfedcba9876543210ull, "checksum %llx", (unsigned long long)u64);
        CHECK(ckpt_h5_attr_read_f64(&f, "/", "x", &f64, err, sizeof err) == 0 && f64 == 0.1, "x");
        CHECK(ckpt_h5_attr_read_str(&f, "/", "job_text", &s, err, sizeof err) == 0 &&
                  strcmp(s, text) == 0, "job_text");
        free(s);
        CHECK(ckpt_h5_attr_read_str(&f, "/", "s", &s, err, sizeof err) == 0 && s[0] == 0, "s");
        free(s);
        CHECK(ckpt_h5_attr_read_i64(&f, "/", "nope", &i64, err, sizeof err) != 0 &&
                  strstr(err, "no attribute 'nope'"), "%s", err);
        ckpt_h5_dataset dx;
        CHECK(ckpt_h5_open_dataset(&f, "/a/missing", &dx, err, sizeof err) != 0 &&
                  strstr(err, "no dataset /a/missing"), "%s", err);
        CHECK(ckpt_h5_exists(&f, "/a/b/m.weight") && !ckpt_h5_exists(&f, "/x/y"), "exists");
        char **names;
        int n;
        CHECK(ckpt_h5_list(&f, "/a", &names, &n, err, sizeof err) == 0 && n == 2 &&
                  strcmp(names[0], "b") == 0 && strcmp(names[1], "v") == 0, "list");
        ckpt_h5_free_names(names, n);
        ckpt_h5_close_dataset(&d2);
        ckpt_h5_close_dataset(&d1);
        CHECK(ckpt_h5_close(&f, err, sizeof err) == 0, "%s", err);
        free(text);
    }
    /* not an HDF5 file, and no file: one clear line each */
    char junk[1100];
    snprintf(junk, sizeof junk, "%s/junk.h5", dir);
    if (rank == 0) {
        FILE *j = fopen(junk, "w");
        fputs("not hdf5\n", j);
        fclose(j);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ckpt_h5_file f;
    CHECK(ckpt_h5_open(&f, junk, MPI_COMM_WORLD, NULL, err, sizeof err) != 0 &&
              strstr(err, "not a readable HDF5 file"), "%s", err);
    snprintf(junk, sizeof junk, "%s/none.h5", dir);
    CHECK(ckpt_h5_open(&f, junk, MPI_COMM_WORLD, NULL, err, sizeof err) != 0 &&
              strstr(err, "No such file"), "%s", err);
}

/* ---- creation is exclusive on every rank: nothing at the name is truncated or followed
 * (Open MPI's MPI_MODE_EXCL: rank 0 creates O_CREAT|O_EXCL, the others open its file) ---- */
static void test_exclusive(const char *dir) {
    char victim[700], target[700], names[3][700], err[1536] = "";
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(target, sizeof target, "%s/not-there", dir);
    const char *kinds[3] = {"link", "dangling", "file"};
    for (int k = 0; k < 3; k++) snprintf(names[k], sizeof names[k], "%s/%s.h5", dir, kinds[k]);
    if (rank == 0) {
        FILE *v = fopen(victim, "w");
        fputs("precious\n", v);
        fclose(v);
        CHECK(symlink(victim, names[0]) == 0 && symlink(target, names[1]) == 0, "symlink");
        v = fopen(names[2], "w");
        fputs("someone's\n", v);
        fclose(v);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ckpt_h5_options opt;
    ckpt_h5_default_options(&opt);
    for (int k = 0; k < 3; k++) {
        ckpt_h5_file f;
        err[0] = '\0';
        int rc = ckpt_h5_create(&f, names[k], MPI_COMM_WORLD, &opt, err, sizeof err);
        CHECK(rc != 0 && strstr(err, names[k]) && strstr(err, "already exists"),
              "create over a %s: rc %d, '%s'", kinds[k], rc, err);
        if (rc == 0) ckpt_h5_close(&f, err, sizeof err);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        char buf[64] = "";
        FILE *v = fopen(victim, "r");
        if (v) {
            if (!fgets(buf, sizeof buf, v)) buf[0] = '\0';
            fclose(v);
        }
        CHECK(strcmp(buf, "precious\n") == 0, "the link's target changed: '%s'", buf);
        CHECK(access(target, F_OK) != 0, "the dangling link's target was created");
        v = fopen(names[2], "r");
        buf[0] = '\0';
        if (v) {
            if (!fgets(buf, sizeof buf, v)) buf[0] = '\0';
            fclose(v);
        }
        CHECK(strcmp(buf, "someone's\n") == 0, "the existing file changed: '%s'", buf);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    check_rank = rank;
    char dir[512];
    if (rank == 0) {
        snprintf(dir, sizeof dir, "%s/shlm-ckpt-h5.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            MPI_Abort(MPI_COMM_WORLD, 99);
        }
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        test_blocks();
        test_checksum();
    }
    test_file(dir);
    test_exclusive(dir);
    if (rank == 0) printf("# %d ranks\n", world);
    const int rc = check_exit_mpi(MPI_COMM_WORLD);
    if (rank == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (rc == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    MPI_Finalize();
    return rc;
}
