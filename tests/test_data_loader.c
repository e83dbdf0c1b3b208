/* Tests of the data loader (src/data/data_loader.c) with 1, 2 and 4 ranks simulated in one
 * process: every world size sees the same samples per step, windows, permutations, epochs. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/data/data_loader.h"
#include "src/base/rng.h"

#include "tests/check.h"

/* An in-memory token file whose token i is i: a row's first input names its window. */
static token_file make_tokens(uint64_t count) {
    token_file tf;
    memset(&tf, 0, sizeof tf);
    snprintf(tf.path, sizeof tf.path, "mem/%llu-tokens.bin", (unsigned long long)count);
    tf.width = 4;
    tf.count = count;
    tf.vocab_size = (uint32_t)count + 1;
    tf.tokens = malloc(count * sizeof *tf.tokens);
    for (uint64_t i = 0; i < count; i++) tf.tokens[i] = (int32_t)i;
    return tf;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The windows one optimizer step hands out over all W ranks and all micro-batches, read
 * from the batches themselves (checking each row is its window's tokens, shifted by one
 * for the targets). Returns 0 if a row is not a window. */
static int step_windows(const token_file *tf, int T, int shuffle, uint64_t seed, int W, int mb,
                        int G, uint64_t step, uint64_t *out) {
    int32_t *in = malloc((size_t)mb * T * sizeof *in), *tg = malloc((size_t)mb * T * sizeof *tg);
    int ok = 1, n = 0;
    for (int r = 0; r < W; r++) {
        data_loader dl;
        char err[512];
        if (data_loader_init(&dl, tf, T, shuffle, seed, r, W, mb, err, sizeof err) != 0) {
            printf("     init failed: %s\n", err);
            ok = 0;
            break;
        }
        for (int m = 0; m < G / (mb * W); m++) {
            if (data_loader_batch(&dl, step * (uint64_t)G, m, in, tg, NULL, err, sizeof err) != 0) {
                printf("     batch failed: %s\n", err);
                ok = 0;
            }
            for (int b = 0; b < mb; b++) {
                int32_t first = in[b * T];
                if (first % T != 0) ok = 0;
                for (int t = 0; t < T; t++)
                    if (in[b * T + t] != first + t || tg[b * T + t] != first + t + 1) ok = 0;
                out[n++] = (uint64_t)first / T;
            }
        }
        data_loader_free(&dl);
    }
    free(in);
    free(tg);
    return ok && n == G;
}

static void test_world_sizes(int shuffle) {
    /* 13 windows, global batch 8: steps straddle epoch boundaries at different offsets */
    const int T = 5, G = 8, steps = 12;
    token_file tf = make_tokens(13 * T + 3);
    uint64_t ref[8], got[8];
    const int worlds[] = {1, 2, 4}, mbs[] = {1, 2};
    for (int wi = 0; wi < 3; wi++) {
        for (int mi = 0; mi < 2; mi++) {
            int W = worlds[wi], mb = mbs[mi], same = 1, rows_ok = 1;
            for (int s = 0; s < steps; s++) {
                rows_ok &= step_windows(&tf, T, shuffle, 42, 1, 1, G, s, ref);
                rows_ok &= step_windows(&tf, T, shuffle, 42, W, mb, G, s, got);
                qsort(ref, G, sizeof *ref, cmp_u64);
                qsort(got, G, sizeof *got, cmp_u64);
                same &= memcmp(ref, got, sizeof ref) == 0;
            }
            check(same && rows_ok,
                  "shuffle %s, W=%d micro_batch %d: every step's samples over all ranks equal "
                  "the 1-rank step's, as a multiset (%d steps, rows are windows)",
                  shuffle ? "on " : "off", W, mb, steps);
        }
    }
    free(tf.tokens);
}

static void test_rank_order(void) {
    const int T = 4;
    token_file tf = make_tokens(10 * T + 1); /* exactly 10 windows */
    int32_t in[2 * 4], tg[2 * 4];
    for (int W = 1; W <= 4; W *= 2) {
        int ok = 1;
        for (int r = 0; r < W; r++) {
            data_loader dl;
            char err[256];
            data_loader_init(&dl, &tf, T, 0, 7, r, W, 1, err, sizeof err);
            /* global batch 4W: 4 micro-batches of one row per rank per step */
            uint64_t k = 0;
            for (uint64_t s = 0; s < 3; s++) {
                for (int m = 0; m < 4; m++, k++) {
                    if (data_loader_batch(&dl, s * 4 * W, m, in, tg, NULL, err, sizeof err) != 0) ok = 0;
                    uint64_t want = (r + k * W) % 10;
                    if ((uint64_t)in[0] != want * T) ok = 0;
                }
            }
            data_loader_free(&dl);
        }
        check(ok, "shuffle off, W=%d: rank r takes windows r, r+W, r+2W, ... (mod 10)", W);
    }
    /* micro_batch 2 on 2 ranks: row b of micro-batch m of rank r is sample (2m+b)*2 + r */
    data_loader dl;
    char err[256];
    data_loader_init(&dl, &tf, T, 0, 7, 1, 2, 2, err, sizeof err);
    int rc = data_loader_batch(&dl, 0, 1, in, tg, NULL, err, sizeof err);
    check(rc == 0 && in[0] == 5 * T && in[T] == 7 * T, "W=2 micro_batch 2, rank 1, micro-batch 1: windows "
          "5 and 7 (got %d, %d)", in[0] / T, in[T] / T);
    data_loader_free(&dl);
    free(tf.tokens);
}

static void test_windows(void) {
    struct { uint64_t count; int T; uint64_t want; } cases[] = {
        {6, 5, 1}, {10, 5, 1}, {11, 5, 2}, {50, 5, 9}, {51, 5, 10}, {52, 5, 10}, {2, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        token_file tf = make_tokens(cases[i].count);
        data_loader dl;
        char err[256] = "";
        int rc = data_loader_init(&dl, &tf, cases[i].T, 0, 1, 0, 1, 1, err, sizeof err);
        check(rc == 0 && dl.n_windows == cases[i].want,
              "%llu tokens, seq_len %d: %llu windows (got %llu) %s",
              (unsigned long long)cases[i].count, cases[i].T,
              (unsigned long long)cases[i].want, (unsigned long long)dl.n_windows, err);
        /* the last window's last target is a real token */
        if (rc == 0) {
            int32_t in[64], tg[64];
            rc = data_loader_batch(&dl, dl.n_windows - 1, 0, in, tg, NULL, err, sizeof err);
            check(rc == 0 && (uint64_t)tg[cases[i].T - 1] < tf.count,
                  "last window stays inside the data %s", err);
            data_loader_free(&dl);
        }
        free(tf.tokens);
    }
}

static void test_too_short(void) {
    token_file tf = make_tokens(256);
    data_loader dl;
    char err[512] = "";
    int rc = data_loader_init(&dl, &tf, 256, 1, 1, 0, 1, 1, err, sizeof err);
    check(rc == -1 && strstr(err, tf.path) && strstr(err, "256 tokens") &&
              strstr(err, "seq_len 256") && strstr(err, "257"),
          "seq_len 256 on 256 tokens fails: %s", err);
    rc = data_loader_init(&dl, &tf, 255, 1, 1, 0, 1, 1, err, sizeof err);
    check(rc == 0 && dl.n_windows == 1, "seq_len 255 on 256 tokens: one window");
    if (rc == 0) data_loader_free(&dl);
    rc = data_loader_init(&dl, &tf, 16, 0, 1, 2, 2, 1, err, sizeof err);
    check(rc == -1 && strstr(err, "rank 2 of 2"), "rank out of range fails: %s", err);
    free(tf.tokens);
}

static int is_permutation(const uint64_t *p, uint64_t n) {
    char *seen = calloc(n, 1);
    int ok = 1;
    for (uint64_t i = 0; i < n; i++) {
        if (p[i] >= n || seen[p[i]]) ok = 0;
        else seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_permutations(void) {
    const int T = 3;
    const uint64_t n = 1000;
    token_file tf = make_tokens(n * T + 1);
    data_loader a, b, c;
    char err[256];
    data_loader_init(&a, &tf, T, 1, 1337, 0, 1, 1, err, sizeof err);
    data_loader_init(&b, &tf, T, 1, 1337, 0, 1, 1, err, sizeof err);
    data_loader_init(&c, &tf, T, 1, 1338, 0, 1, 1, err, sizeof err);
    uint64_t *e0 = malloc(n * sizeof *e0), *e1 = malloc(n * sizeof *e1);
    uint64_t *e0b = malloc(n * sizeof *e0b), *s2 = malloc(n * sizeof *s2);
    for (uint64_t i = 0; i < n; i++) e0[i] = data_loader_window(&a, i);
    for (uint64_t i = 0; i < n; i++) e1[i] = data_loader_window(&a, n + i);
    for (uint64_t i = 0; i < n; i++) s2[i] = data_loader_window(&c, i);
    check(is_permutation(e0, n) && is_permutation(e1, n),
          "epochs 0 and 1 each visit every one of %llu windows once",
          (unsigned long long)n);
    uint64_t fixed = 0, same01 = 0, same_seed = 0;
    for (uint64_t i = 0; i < n; i++) {
        fixed += e0[i] == i;
        same01 += e0[i] == e1[i];
        same_seed += e0[i] == s2[i];
    }
    /* a random permutation has ~1 fixed point; 10 of 1000 would mean a broken shuffle */
    check(fixed < 10 && same01 < 10 && same_seed < 10,
          "shuffled: %llu fixed points, %llu equal positions between epochs 0/1, %llu between "
          "seeds 1337/1338 (each < 10)",
          (unsigned long long)fixed, (unsigned long long)same01, (unsigned long long)same_seed);

    /* determinism: a fresh loader, visiting epochs out of order, agrees */
    int det = 1;
    for (uint64_t i = 0; i < n; i++) det &= data_loader_window(&b, n + i) == e1[i];
    for (uint64_t i = 0; i < n; i++) e0b[i] = data_loader_window(&b, i);
    det &= memcmp(e0, e0b, n * sizeof *e0) == 0;
    for (uint64_t i = 0; i < n; i += 97) det &= data_loader_window(&b, 5 * n + i) ==
                                               data_loader_window(&a, 5 * n + i);
    check(det, "same (seed, epoch) gives the same permutation in another loader, in any order");

    /* the order itself is a contract with checkpoints (they store only the sample index):
     * these values pin it, so a change to the shuffle shows up here */
    uint64_t first[5];
    for (int i = 0; i < 5; i++) first[i] = e0[i];
    static const uint64_t pinned[5] = {258, 439, 76, 850, 343};
    check(memcmp(first, pinned, sizeof first) == 0,
          "seed 1337, 1000 windows, epoch 0 starts %llu %llu %llu %llu %llu (pinned)",
          (unsigned long long)first[0], (unsigned long long)first[1],
          (unsigned long long)first[2], (unsigned long long)first[3],
          (unsigned long long)first[4]);

    /* epoch wrap without shuffle: sample n is window 0 again */
    data_loader d;
    data_loader_init(&d, &tf, T, 0, 1337, 0, 1, 1, err, sizeof err);
    check(data_loader_window(&d, n - 1) == n - 1 && data_loader_window(&d, n) == 0 &&
              data_loader_window(&d, 3 * n + 7) == 7,
          "shuffle off: sample n-1 -> window n-1, n -> 0, 3n+7 -> 7");
    /* shuffled epochs wrap too: samples [2n, 3n) are epoch 2's permutation, a new one */
    uint64_t same12 = 0;
    for (uint64_t i = 0; i < n; i++) e0b[i] = data_loader_window(&a, 2 * n + i);
    for (uint64_t i = 0; i < n; i++) same12 += e0b[i] == e1[i];
    check(is_permutation(e0b, n) && same12 < 10,
          "shuffle on: samples [2n, 3n) are a permutation of the windows, unlike epoch 1's");

    data_loader_free(&a);
    data_loader_free(&b);
    data_loader_free(&c);
    data_loader_free(&d);
    free(e0), free(e1), free(e0b), free(s2);
    free(tf.tokens);
}

/* data_loader_reposition against the window layout itself: for every position of a
 * few epochs, the new window is the first of the new length starting at or after the
 * first token the old position had not read, in the same epoch. */
static void test_reposition(void) {
    const uint64_t n = 1001; /* 1000 windows of 1, 31 of 32, 62 of 16 (+ 1 token), 20 of 50 */
    const int lens[] = {32, 16, 50, 1};
    int bad = 0, cases = 0;
    for (int a = 0; a < 4; a++) {
        for (int b = 0; b < 4; b++) {
            const int to = lens[a], tn = lens[b];
            const uint64_t nwo = (n - 1) / (uint64_t)to, nwn = (n - 1) / (uint64_t)tn;
            for (uint64_t p = 0; p < 3 * nwo; p++) {
                uint64_t q = 0;
                const uint64_t tok = p % nwo * (uint64_t)to; /* first unread token */
                if (data_loader_reposition(p, n, to, tn, &q) != 0) { bad++; continue; }
                const uint64_t start = (q - p / nwo * nwn) * (uint64_t)tn; /* q's first token */
                bad += !(q >= p / nwo * nwn && start >= tok && start < tok + (uint64_t)tn);
                cases++;
            }
        }
    }
    uint64_t q = 0;
    check(bad == 0 && cases > 0, "reposition: %d positions of 4 x 4 lengths, each the first new "
          "window at or after the first unread token of its epoch (%d wrong)", cases, bad);
    const int rc = data_loader_reposition(80, 100000, 32, 16, &q);
    check(rc == 0 && q == 160, "reposition: window 80 of 32 tokens -> window 160 of 16 (got %llu)",
          (unsigned long long)q);
    check(data_loader_reposition(5, 10, 32, 16, &q) == -1, "reposition: no window of 32 in 10 tokens");
}

/* Packed documents: tokens i, documents starting at `starts` (and token 0), every third
 * token untrained; in memory (flags) or written to a version-2 file and opened. */
static token_file make_docs(uint64_t count, int on_disk, const char *path) {
    token_file tf = make_tokens(count);
    tf.flags = malloc(count);
    uint64_t next = 0;
    for (uint64_t i = 0; i < count; i++) {
        const int start = i == next;
        if (start) next += 1 + rng_hash64(i) % 23; /* documents of 1..23 tokens */
        tf.flags[i] = (uint8_t)((start ? TOKEN_DOC_START : 0) | (i % 3 ? TOKEN_TRAINED : 0));
    }
    if (!on_disk) return tf;
    char err[1024] = "";
    token_file disk;
    if (token_file_write(path, tf.tokens, tf.flags, count, 4, tf.vocab_size, NULL, err,
                         sizeof err) != 0 ||
        token_file_open(&disk, path, err, sizeof err) != 0)
        printf("     %s\n", err);
    token_file_close(&tf);
    return disk;
}

/* One rank's batches of a step against the rules written out here again: targets -1 where
 * the next token is untrained (or, doc_mask, starts a document), doc_start the latest
 * document start at or before t inside the row. Adds the row's trained targets to *n. */
static int check_rows(const token_file *tf, const uint8_t *fl, int T, int mb, int doc_mask,
                      const int32_t *in, const int32_t *tg, const int32_t *ds, int64_t *n) {
    int ok = 1;
    for (int b = 0; b < mb; b++) {
        const int32_t w = in[b * T]; /* token i is i: the window's first token */
        for (int t = 0; t < T; t++) {
            const uint8_t next = fl[w + t + 1];
            const int trained = (next & TOKEN_TRAINED) && !(doc_mask && (next & TOKEN_DOC_START));
            ok &= in[b * T + t] == w + t;
            ok &= tg[b * T + t] == (trained ? w + t + 1 : -1);
            *n += trained;
            if (doc_mask) {
                int want = 0;
                for (int k = t; k >= 0; k--)
                    if (fl[w + k] & TOKEN_DOC_START) {
                        want = k;
                        break;
                    }
                ok &= ds[b * T + t] == want;
            }
        }
    }
    (void)tf;
    return ok;
}

static void test_masks_and_docs(const char *tmp) {
    const int T = 8, G = 8, steps = 7;
    char path[600];
    snprintf(path, sizeof path, "%s/docs.bin", tmp);
    for (int disk = 0; disk < 2; disk++) {
        token_file tf = make_docs(11 * T + 3, disk, path);
        /* the flags as the rules see them (the file's, read back whole) */
        uint8_t *fl = malloc(tf.count);
        char err[1024] = "";
        token_file_read_flags(&tf, 0, tf.count, fl, err, sizeof err);
        for (int doc_mask = 0; doc_mask < 2; doc_mask++) {
            const int worlds[] = {1, 2, 4}, mbs[] = {1, 2};
            for (int wi = 0; wi < 3; wi++)
                for (int mi = 0; mi < 2; mi++) {
                    const int W = worlds[wi], mb = mbs[mi];
                    int ok = 1, counts_ok = 1;
                    int32_t in[16], tg[16], ds[16];
                    for (int s = 0; s < steps; s++) {
                        int64_t seen = 0, counted = -1;
                        for (int r = 0; r < W; r++) {
                            data_loader dl;
                            ok &= data_loader_init(&dl, &tf, T, 1, 99, r, W, mb, err, sizeof err) == 0;
                            dl.doc_mask = doc_mask;
                            for (int m = 0; ok && m < G / (W * mb); m++) {
                                ok &= data_loader_batch(&dl, (uint64_t)s * G, m, in, tg,
                                                        doc_mask ? ds : NULL, err, sizeof err) == 0;
                                ok &= check_rows(&tf, fl, T, mb, doc_mask, in, tg, ds, &seen);
                            }
                            int64_t c = -1;
                            ok &= data_loader_count_targets(&dl, (uint64_t)s * G, G, &c, err, sizeof err) == 0;
                            if (counted >= 0 && c != counted) counts_ok = 0;
                            counted = c;
                            data_loader_free(&dl);
                        }
                        counts_ok &= counted == seen;
                    }
                    check(ok && counts_ok,
                          "%s, doc_mask %d, W=%d micro_batch %d: masked targets are -1, doc_start "
                          "is the row's latest document start, and every rank's count of a "
                          "step's trained targets equals the targets in all ranks' batches %s",
                          disk ? "version-2 file" : "in memory", doc_mask, W, mb, err);
                }
        }
        free(fl);
        token_file_close(&tf);
    }
    remove(path);

    /* a file without masks: every target counts (the shortcut), doc_mask or not */
    token_file plain = make_tokens(5 * T + 1);
    data_loader dl;
    char err[256] = "";
    data_loader_init(&dl, &plain, T, 0, 1, 0, 1, 1, err, sizeof err);
    int64_t c0 = -1, c1 = -1;
    data_loader_count_targets(&dl, 3, 4, &c0, err, sizeof err);
    dl.doc_mask = 1;
    data_loader_count_targets(&dl, 3, 4, &c1, err, sizeof err);
    check(c0 == 4 * T && c1 == 4 * T, "no masks: 4 samples count 4 x %d targets (%lld, %lld)", T,
          (long long)c0, (long long)c1);
    data_loader_free(&dl);
    free(plain.tokens);

    /* a window with nothing trained: every target -1, a count of 0 */
    token_file none = make_tokens(2 * T + 1);
    none.flags = calloc(none.count, 1);
    none.flags[0] = TOKEN_DOC_START;
    data_loader_init(&dl, &none, T, 0, 1, 0, 1, 1, err, sizeof err);
    int32_t in[8], tg[8];
    int all_ignored = data_loader_batch(&dl, 0, 0, in, tg, NULL, err, sizeof err) == 0;
    for (int t = 0; t < T; t++) all_ignored &= tg[t] == -1;
    int64_t c = -1;
    data_loader_count_targets(&dl, 0, 2, &c, err, sizeof err);
    check(all_ignored && c == 0, "nothing trained: every target -1, count %lld", (long long)c);
    data_loader_free(&dl);
    token_file_close(&none);
}

int main(int argc, char **argv) {
    char cwd[512];
    printf("# reproduce: cd %s && %s\n", getcwd(cwd, sizeof cwd) ? cwd : ".", argv[0]);
    (void)argc;
    test_windows();
    test_too_short();
    test_rank_order();
    test_world_sizes(0);
    test_world_sizes(1);
    test_permutations();
    test_reposition();
    const char *tmp = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/shlm-test-loader-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    test_masks_and_docs(dir);
    rmdir(dir);
    return check_exit();
}
