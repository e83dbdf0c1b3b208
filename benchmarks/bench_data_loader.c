/* The data-loader benchmark: data_loader_batch over a large token file, shuffled windows,
 * microseconds per micro-batch and GB/s of tokens delivered; every token checked. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "io/tokens.h"
#include "src/data_loader.h"
#include "src/rng.h"

enum { VOCAB = 32000 };

/* Token i of the benchmark's file: a pure function of i, so batches check themselves. */
static int32_t expected_token(uint64_t i) { return (int32_t)(rng_hash64(i) % VOCAB); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: bench_data_loader [options] FILE\n"
            "  FILE is created (2-byte tokens, vocab 32000) when it does not exist or holds\n"
            "  another token count; the timed part reads it through data_loader_batch.\n"
            "  --tokens N        tokens in FILE (default 1073741824: a 2 GiB file)\n"
            "  --seq-len T       sequence length (default 4096)\n"
            "  --micro-batch B   rows per micro-batch (default 8)\n"
            "  --batches K       timed micro-batches (default 2000)\n");
}

static int make_file(const char *path, uint64_t n) {
    int32_t *tok = malloc(n * sizeof *tok);
    if (!tok) {
        fprintf(stderr, "bench_data_loader: out of memory for %llu tokens\n",
                (unsigned long long)n);
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) tok[i] = expected_token(i);
    char err[1536] = "";
    int rc = token_file_write(path, tok, n, 2, VOCAB, err, sizeof err);
    free(tok);
    if (rc != 0) fprintf(stderr, "bench_data_loader: %s\n", err);
    return rc;
}

int main(int argc, char **argv) {
    uint64_t n_tokens = 1ull << 30;
    int T = 4096, mb = 8;
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
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!path || T < 1 || mb < 1 || batches < 1 || n_tokens < (uint64_t)T + 1) {
        usage(stderr);
        return 2;
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || (uint64_t)sb.st_size != TOKENS_HEADER_BYTES + 2 * n_tokens) {
        printf("# writing %s: %llu tokens\n", path, (unsigned long long)n_tokens);
        fflush(stdout);
        if (make_file(path, n_tokens) != 0) return 1;
    }

    char err[1536] = "";
    token_file tf;
    double t0 = now_s();
    if (token_file_open(&tf, path, err, sizeof err) != 0) {
        fprintf(stderr, "bench_data_loader: %s\n", err);
        return 1;
    }
    const double open_s = now_s() - t0;
    data_loader dl;
    if (data_loader_init(&dl, &tf, T, 1, 1337, 0, 1, mb, err, sizeof err) != 0) {
        fprintf(stderr, "bench_data_loader: %s\n", err);
        return 1;
    }
    const size_t n = (size_t)mb * T;
    int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    if (!in || !tg) return 1;
    /* untimed: one pass over the batches to come builds the permutation */
    data_loader_window(&dl, 0);
    double busy = 0;
    long long wrong = 0;
    for (long k = 0; k < batches; k++) {
        const uint64_t start = (uint64_t)k * mb;
        t0 = now_s();
        if (data_loader_batch(&dl, start, 0, in, tg, err, sizeof err) != 0) {
            fprintf(stderr, "bench_data_loader: %s\n", err);
            return 1;
        }
        busy += now_s() - t0;
        for (int b = 0; b < mb; b++) {
            const uint64_t w = data_loader_window(&dl, start + (uint64_t)b) * (uint64_t)T;
            for (int t = 0; t < T; t++) {
                wrong += in[(size_t)b * T + t] != expected_token(w + t);
                wrong += tg[(size_t)b * T + t] != expected_token(w + t + 1);
            }
        }
    }
    const double us = 1e6 * busy / batches;
    const double gbs = (double)batches * mb * (T + 1) * tf.width / busy / 1e9;
    printf("# file %s: %llu tokens of %d bytes, validated at open in %.2f s\n", path,
           (unsigned long long)tf.count, tf.width, open_s);
    printf("# %8s %12s %8s %12s %10s %8s\n", "seq_len", "micro_batch", "batches", "us/batch",
           "GB/s", "#wrong");
    printf("  %8d %12d %8ld %12.2f %10.3f %8lld\n", T, mb, batches, us, gbs, wrong);
    free(in);
    free(tg);
    data_loader_free(&dl);
    token_file_close(&tf);
    return wrong == 0 ? 0 : 1;
}
