/* `shardlm data prepare`: turns a text file into a token file with any tokenizer
 * (src/tokenizer.h; the file is one document); `shardlm data random`: uniform random
 * tokens for benchmarks at any vocabulary; `data encode|decode|tokenizer` are in
 * src/cmd_tokenize.c. A plain process: it needs no MPI. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safe_file.h"
#include "io/tokens.h"
#include "src/commands.h"
#include "src/rng.h"
#include "src/tokenizer.h"

static void data_usage(FILE *out) {
    fprintf(out, "usage: shardlm data prepare --tokenizer T [--width 2|4] IN.txt OUT.bin\n"
                 "  --tokenizer T       a tokenizer.model or tokenizer.json file, a model directory\n"
                 "                      holding one, or bytes (token = byte value, vocab 256);\n"
                 "                      IN is one document: bos as the model says, eos at the end\n"
                 "  --width 2|4         bytes per token in OUT (default: 2 when the vocab fits)\n"
                 "       shardlm data encode|decode|tokenizer --tokenizer T ...\n"
                 "  text <-> ids on stdin/stdout (shardlm data encode --help)\n"
                 "       shardlm data random --vocab V --tokens N [--seed S] OUT.bin\n"
                 "  uniform random token ids in [0, V), for benchmarks (width 2 if V <= 65536)\n");
}

/* Prints the one-line error; usage problems exit 2, everything else 1. */
static int fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "shardlm: error: data: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return status;
}

/* Reads a whole file; returns a malloc'd buffer (NULL with errno set on failure). */
static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        unsigned char *grown = realloc(buf, cap * 2);
        if (!grown) free(buf);
        buf = grown;
        cap *= 2;
    }
    int bad = !buf || ferror(f);
    int saved = buf ? errno : ENOMEM;
    fclose(f);
    if (bad) {
        free(buf);
        errno = saved;
        return NULL;
    }
    *len = n;
    return buf;
}

static int parse_u64(const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s == '-' || *s == 0 || *end != 0 || errno) return -1;
    *out = v;
    return 0;
}

/* shardlm data random --vocab V --tokens N [--seed S] OUT.bin */
static int data_random(int argc, char **argv) {
    unsigned long long vocab = 0, count = 0, seed = 1;
    const char *out = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        unsigned long long *dst = strcmp(a, "--vocab") == 0    ? &vocab
                                  : strcmp(a, "--tokens") == 0 ? &count
                                  : strcmp(a, "--seed") == 0   ? &seed
                                                               : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: shardlm data random --vocab V --tokens N [--seed S] OUT.bin\n"
                   "  N uniform random token ids in [0, V) (seed S, default 1) as a token file,\n"
                   "  width 2 if V <= 65536: data for benchmarks and tests\n");
            return 0;
        }
        if (dst) {
            if (i + 1 >= argc || parse_u64(argv[i + 1], dst) != 0)
                return fail(2, "%s needs a non-negative integer", a);
            i++;
        } else if (a[0] == '-') {
            return fail(2, "unknown option '%s'", a);
        } else if (!out) {
            out = a;
        } else {
            return fail(2, "unexpected argument '%s' (takes OUT.bin)", a);
        }
    }
    if (vocab < 2 || vocab > 0x7fffffffull) return fail(2, "--vocab must be in [2, 2^31)");
    if (count < 2) return fail(2, "--tokens must be at least 2");
    if (!out) return fail(2, "random needs OUT.bin");
    int32_t *tokens = malloc(count * sizeof *tokens);
    if (!tokens) return fail(1, "out of memory for %llu tokens", count);
    for (unsigned long long i = 0; i < count; i++)
        tokens[i] = (int32_t)(rng_hash64(seed * 0x9E3779B97F4A7C15ull ^ i) % vocab);
    char err[1536];
    int rc = token_file_write(out, tokens, count, vocab <= 65536 ? 2 : 4, (uint32_t)vocab, err,
                              sizeof err);
    free(tokens);
    if (rc != 0) return fail(1, "%s", err);
    printf("wrote %llu random tokens (vocab %llu) to %s\n", count, vocab, out);
    return 0;
}

int cmd_data(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        data_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "random") == 0) return data_random(argc, argv);
    if (strcmp(argv[1], "encode") == 0) return cmd_data_encode(argc, argv);
    if (strcmp(argv[1], "decode") == 0) return cmd_data_decode(argc, argv);
    if (strcmp(argv[1], "tokenizer") == 0) return cmd_data_tokenizer(argc, argv);
    if (strcmp(argv[1], "prepare") != 0)
        return fail(2, "unknown subcommand '%s' (try: shardlm data prepare --help)", argv[1]);

    const char *tokenizer = NULL, *width_arg = NULL, *paths[2] = {NULL, NULL};
    int n_paths = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            data_usage(stdout);
            return 0;
        } else if (strcmp(a, "--tokenizer") == 0 || strcmp(a, "--width") == 0) {
            dst = a[2] == 't' ? &tokenizer : &width_arg;
            if (i + 1 >= argc) return fail(2, "%s needs a value", a);
            *dst = argv[++i];
        } else if (strncmp(a, "--tokenizer=", 12) == 0) {
            tokenizer = a + 12;
        } else if (strncmp(a, "--width=", 8) == 0) {
            width_arg = a + 8;
        } else if (a[0] == '-' && a[1] != '\0') {
            return fail(2, "unknown option '%s'", a);
        } else if (n_paths < 2) {
            paths[n_paths++] = a;
        } else {
            return fail(2, "unexpected argument '%s' (takes IN.txt OUT.bin)", a);
        }
    }
    if (!tokenizer)
        return fail(2, "--tokenizer is required (a tokenizer file, a model directory, or bytes)");
    int width = !width_arg ? 0 : strcmp(width_arg, "2") == 0 ? 2 : strcmp(width_arg, "4") == 0 ? 4 : -1;
    if (width < 0) return fail(2, "--width must be 2 or 4, not '%s'", width_arg);
    if (n_paths != 2) return fail(2, "prepare needs IN.txt and OUT.bin");
    /* the output replaces its name: were it the input (by any path or link), the text
     * would be gone */
    if (safe_file_same(paths[0], paths[1]))
        return fail(1, "%s is the input file %s itself (same file): refusing to replace the "
                    "text with its tokens; choose another OUT.bin", paths[1], paths[0]);
    char err[1536];
    struct tokenizer *tok; /* (`tokenizer` is the option's name here) */
    if (tokenizer_open(&tok, tokenizer, err, sizeof err) != 0) return fail(1, "%s", err);
    uint32_t vocab = tokenizer_vocab_size(tok);
    if (!width) width = vocab <= 65536 ? 2 : 4;
    if (width == 2 && vocab > 65536) {
        tokenizer_free(tok);
        return fail(2, "--width 2 cannot hold the ids of %s (vocab %u > 65536)", tokenizer, vocab);
    }

    size_t n = 0;
    unsigned char *text = read_all(paths[0], &n);
    if (!text) {
        tokenizer_free(tok);
        return fail(1, "%s: cannot read: %s", paths[0], strerror(errno));
    }
    if (n == 0) {
        free(text);
        tokenizer_free(tok);
        return fail(1, "%s: empty file, nothing to tokenize", paths[0]);
    }
    token_ids ids = {0};
    int rc = tokenizer_encode_with(tok, (const char *)text, n, tokenizer_document_flags(tok), &ids,
                                   err, sizeof err);
    free(text);
    tokenizer_free(tok);
    if (rc != 0) {
        free(ids.ids);
        return fail(1, "%s: %s", paths[0], err);
    }
    rc = token_file_write(paths[1], ids.ids, ids.n, width, vocab, err, sizeof err);
    free(ids.ids);
    if (rc != 0) return fail(1, "%s", err);
    printf("wrote %zu tokens (vocab %u) to %s\n", ids.n, vocab, paths[1]);
    return 0;
}
