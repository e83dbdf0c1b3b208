/* The data-loader benchmark: data_loader_batch over a large token file, shuffled windows,
 * microseconds per micro-batch and GB/s of tokens delivered, for a version-1 file (ids
 * only) and a version-2 file of packed documents with loss masks, without and with
 * doc_mask; and data_loader_count_targets, the per-step count of trained targets. Every
 * token, target and document start is checked against what the files were made from. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "io/tokens.h"
#include "src/data/data_loader.h"
#include "src/base/rng.h"

enum { VOCAB = 32000 };

/* Token i of the benchmark's files: a pure function of i, so batches check themselves. */
static int32_t expected_token(uint64_t i) { return (int32_t)(rng_hash64(i) % VOCAB); }

/* The version-2 file's flags: documents of 64..1087 tokens (SFT-sized), each a prompt of
 * a third of it (untrained) then a trained response. A pure function of i too. */
static void make_flags(uint8_t *flags, uint64_t n) {
    for (uint64_t start = 0, d = 0; start < n; d++) {
        const uint64_t len = 64 + rng_hash64(~d) % 1024, prompt = len / 3;
        for (uint64_t k = 0; k < len && start + k < n; k++)
            flags[start + k] = (uint8_t)((k == 0 ? TOKEN_DOC_START : 0) |
                                         (k >= prompt ? TOKEN_TRAINED : 0));
        start += len;
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: bench_data_loader [options] FILE\n"
            "  FILE.v1 and FILE.v2 are created (2-byte tokens, vocab 32000) when missing or of\n"
            "  another token count: v1 holds ids only, v2 packed documents with loss masks;\n"
            "  the timed part reads them through data_loader_batch.\n"
            "  --tokens N        tokens in each file (default 1073741824: 2 GiB of ids)\n"
            "  --seq-len T       sequence length (default 4096)\n"
            "  --micro-batch B   rows per micro-batch (default 2: a 7B micro-batch on one H200)\n"
            "  --batches K       timed micro-batches per row (default 2000)\n"
            "  --global-batch G  samples per step for the target count (default 512)\n");
}

/* The version-1 layout (io/tokens.h), which no writer makes any more: 32-byte header, ids. */
static int write_v1(const char *path, const int32_t *tok, uint64_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    unsigned char h[TOKENS_HEADER_V1_BYTES] = {0};
    memcpy(h, TOKENS_MAGIC, 8);
    const uint64_t fields[4] = {1, 2, n, VOCAB}; /* version, width, count, vocab */
    const int at[4] = {8, 12, 16, 24}, size[4] = {4, 4, 8, 4};
    for (int k = 0; k < 4; k++)
        for (int b = 0; b < size[k]; b++) h[at[k] + b] = (unsigned char)(fields[k] >> (8 * b));
    int ok = fwrite(h, 1, sizeof h, f) == sizeof h;
    for (uint64_t i = 0; ok && i < n; i++) {
        const unsigned char le[2] = {(unsigned char)tok[i], (unsigned char)(tok[i] >> 8)};
        ok = fwrite(le, 1, 2, f) == 2;
    }
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int make_files(const char *v1, const char *v2, uint64_t n) {
    int32_t *tok = malloc(n * sizeof *tok);
    uint8_t *flags = malloc(n);
    if (!tok || !flags) {
        fprintf(stderr, "bench_data_loader: out of memory for %llu tokens\n",
                (unsigned long long)n);
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) tok[i] = expected_token(i);
    make_flags(flags, n);
    char err[1536] = "";
    int rc = write_v1(v1, tok, n);
    if (rc != 0) snprintf(err, sizeof err, "%s: cannot write", v1);
    if (rc == 0) rc = token_file_write(v2, tok, flags, n, 2, VOCAB, NULL, err, sizeof err);
    free(tok);
    free(flags);
    if (rc != 0) fprintf(stderr, "bench_data_loader: %s\n", err);
    return rc;
}

/* One timed row: K micro-batches of file tf (doc_mask as given), each checked. */
typedef struct row {
    const char *name;
    double us, gbs;
    long long wrong;
} row;

static int time_batches(const token_file *tf, const uint8_t *flags, int T, int mb, long K,
                        int doc_mask, row *out) {
    char err[1536] = "";
    data_loader dl;
    if (data_loader_init(&dl, tf, T, 1, 1337, 0, 1, mb, err, sizeof err) != 0) {
        fprintf(stderr, "bench_data_loader: %s\n", err);
        return -1;
    }
    dl.doc_mask = doc_mask;
    const size_t n = (size_t)mb * T;
    int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg), *ds = malloc(n * sizeof *ds);
    if (!in || !tg || !ds) return -1;
    data_loader_window(&dl, 0); /* untimed: the permutation */
    for (long k = 0; k < K / 10; k++) /* untimed: warm caches, as later batches find them */
        if (data_loader_batch(&dl, (uint64_t)(K + k) * mb, 0, in, tg, ds, err, sizeof err) != 0) {
            fprintf(stderr, "bench_data_loader: %s\n", err);
            return -1;
        }
    double busy = 0;
    long long wrong = 0;
    for (long k = 0; k < K; k++) {
        const uint64_t start = (uint64_t)k * mb;
        double t0 = now_s();
        if (data_loader_batch(&dl, start, 0, in, tg, ds, err, sizeof err) != 0) {
            fprintf(stderr, "bench_data_loader: %s\n", err);
            return -1;
        }
        busy += now_s() - t0;
        for (int b = 0; b < mb; b++) {
            const uint64_t w = data_loader_window(&dl, start + (uint64_t)b) * (uint64_t)T;
            int32_t doc = 0;
            for (int t = 0; t < T; t++) {
                const size_t i = (size_t)b * T + t;
                const uint8_t next = flags ? flags[w + t + 1] : TOKEN_TRAINED;
                if (flags && (flags[w + t] & TOKEN_DOC_START)) doc = t;
                wrong += in[i] != expected_token(w + t);
                wrong += tg[i] != (data_loader_target_trained(next, doc_mask)
                                       ? expected_token(w + t + 1) : -1);
                wrong += doc_mask && ds[i] != doc;
            }
        }
    }
    out->us = 1e6 * busy / K;
    out->gbs = (double)K * mb * (T + 1) * tf->width / busy / 1e9;
    out->wrong = wrong;
    free(in);
    free(tg);
    free(ds);
    data_loader_free(&dl);
    return 0;
}

int main(int argc, char **argv) {
    uint64_t n_tokens = 1ull << 30;
    int T = 4096, mb = 2, G = 512;
    long batches = 2000;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--tokens") == 0 && v) {
            n_tokens = strtoull(v, NULL, 10), i++;
        } else if (strcmp(a, "--seq-len") == 0 && v) {
            T = atoi(v), i++;
        } else if (strcmp(a, "--micro-batch") == 0 && v) {
            mb = atoi(v), i++;
        } else if (strcmp(a, "--batches") == 0 && v) {
            batches = atol(v), i++;
        } else if (strcmp(a, "--global-batch") == 0 && v) {
            G = atoi(v), i++;
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!path || T < 1 || mb < 1 || G < 1 || batches < 1 || n_tokens < (uint64_t)T + 1) {
        usage(stderr);
        return 2;
    }
    char v1[1100], v2[1100];
    snprintf(v1, sizeof v1, "%s.v1", path);
    snprintf(v2, sizeof v2, "%s.v2", path);
    struct stat s1, s2;
    if (stat(v1, &s1) != 0 || (uint64_t)s1.st_size != TOKENS_HEADER_V1_BYTES + 2 * n_tokens ||
        stat(v2, &s2) != 0 ||
        (uint64_t)s2.st_size != TOKENS_HEADER_BYTES + (2 * n_tokens + 7) / 8 * 8 +
                                    16 * ((n_tokens + 63) / 64)) {
        printf("# writing %s and %s: %llu tokens each\n", v1, v2, (unsigned long long)n_tokens);
        fflush(stdout);
        if (make_files(v1, v2, n_tokens) != 0) return 1;
    }
    uint8_t *flags = malloc(n_tokens);
    if (!flags) return 1;
    make_flags(flags, n_tokens);

    char err[1536] = "";
    token_file f1, f2;
    double t0 = now_s();
    if (token_file_open(&f1, v1, err, sizeof err) != 0) {
        fprintf(stderr, "bench_data_loader: %s\n", err);
        return 1;
    }
    const double open1 = now_s() - t0;
    t0 = now_s();
    if (token_file_open(&f2, v2, err, sizeof err) != 0) {
        fprintf(stderr, "bench_data_loader: %s\n", err);
        return 1;
    }
    const double open2 = now_s() - t0;
    printf("# files: %llu tokens of 2 bytes; validated at open in %.2f s (v1), %.2f s (v2: "
           "%llu documents, %.1f%% trained)\n", (unsigned long long)n_tokens, open1, open2,
           (unsigned long long)f2.documents, 100.0 * (double)f2.trained / (double)f2.count);
    row rows[3] = {{.name = "v1 ids only"}, {.name = "v2 masks"}, {.name = "v2 masks + doc_mask"}};
    if (time_batches(&f1, NULL, T, mb, batches, 0, &rows[0]) != 0 ||
        time_batches(&f2, flags, T, mb, batches, 0, &rows[1]) != 0 ||
        time_batches(&f2, flags, T, mb, batches, 1, &rows[2]) != 0)
        return 1;
    printf("# %-22s %8s %12s %8s %12s %10s %8s\n", "file", "seq_len", "micro_batch", "batches",
           "us/batch", "GB/s", "#wrong");
    long long wrong = 0;
    for (int k = 0; k < 3; k++) {
        printf("  %-22s %8d %12d %8ld %12.2f %10.3f %8lld\n", rows[k].name, T, mb, batches,
               rows[k].us, rows[k].gbs, rows[k].wrong);
        wrong += rows[k].wrong;
    }
    /* the per-step count every rank makes: G windows' targets, against a direct count */
    data_loader dl;
    if (data_loader_init(&dl, &f2, T, 1, 1337, 0, 1, mb, err, sizeof err) != 0) return 1;
    dl.doc_mask = 1;
    const long steps = batches / 10 > 0 ? batches / 10 : 1;
    double busy = 0;
    for (long s = 0; s < steps; s++) {
        int64_t got = 0, want = 0;
        t0 = now_s();
        if (data_loader_count_targets(&dl, (uint64_t)s * G, (uint64_t)G, &got, err, sizeof err)) {
            fprintf(stderr, "bench_data_loader: %s\n", err);
            return 1;
        }
        busy += now_s() - t0;
        for (int g = 0; g < G; g++) {
            const uint64_t w = data_loader_window(&dl, (uint64_t)s * G + g) * (uint64_t)T;
            for (int t = 1; t <= T; t++) want += data_loader_target_trained(flags[w + t], 1);
        }
        wrong += got != want;
    }
    printf("# count of a step's trained targets (doc_mask), %d samples of %d tokens: %.1f us "
           "per step (%.2f us per sample), %ld steps, #wrong %lld\n", G, T, 1e6 * busy / steps,
           1e6 * busy / steps / G, steps, wrong);
    data_loader_free(&dl);
    token_file_close(&f1);
    token_file_close(&f2);
    free(flags);
    return wrong == 0 ? 0 : 1;
}
