/* `shardlm data prepare`: turns text, JSONL text, prompt-response and chat files into a
 * token file with any tokenizer (the formats: src/data/data_prepare.h); `data render`: the
 * documents as text with what is trained; `data info`: what a token file holds;
 * `data random`: uniform random tokens for benchmarks at any vocabulary;
 * `data encode|decode|tokenizer` are in src/cli/cmd_tokenize.c. A plain process: no MPI. */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/safe_file.h"
#include "io/tokens.h"
#include "src/data/chat_template.h"
#include "src/cli/cli_fail.h"
#include "src/cli/commands.h"
#include "src/data/data_prepare.h"
#include "src/base/rng.h"
#include "src/base/numbers.h"
#include "src/tokenizer/tokenizer.h"

static void data_usage(FILE *out) {
    fprintf(out,
            "usage: shardlm data prepare --tokenizer T [--format F] [--chat-template C]\n"
            "                            [--max-doc-len N [--overlong truncate|drop]] [--width 2|4]\n"
            "                            IN OUT.bin\n"
            "  --tokenizer T       a tokenizer.model or tokenizer.json file, a model directory\n"
            "                      holding one, or bytes (token = byte value, vocab 256)\n"
            "  --format F          text (default: IN is one document, bos as the model says, eos\n"
            "                      at the end), jsonl-text ({\"text\"} per line), prompt-response\n"
            "                      ({\"prompt\", \"response\"} or Alpaca's {\"instruction\", \"input\",\n"
            "                      \"output\"} per line; the loss covers the response and its end),\n"
            "                      chat ({\"messages\": [{\"role\", \"content\"}, ...]} per line; the\n"
            "                      loss covers the assistant turns)\n"
            "  --chat-template C   auto (default: the model's own, which must be ChatML,\n"
            "                      Qwen2.5's, Llama-2's or Llama-3.1's), chatml, qwen2.5,\n"
            "                      llama2, llama3, or none\n"
            "                      (prompt-response without a template: bos, prompt, response,\n"
            "                      eos)\n"
            "  --max-doc-len N     documents longer than N tokens are truncated to N (default)\n"
            "                      or dropped (--overlong drop), and counted; default: no limit\n"
            "                      (a job's seq_len + 1 is the useful value)\n"
            "  --width 2|4         bytes per token in OUT (default: 2 when the vocab fits)\n"
            "       shardlm data info FILE.bin\n"
            "  version, tokens, documents, trained tokens, longest document, truncated/dropped\n"
            "       shardlm data render --tokenizer T --format F [--chat-template C] IN\n"
            "  each document as a JSON line: {\"line\", \"text\", \"trained\": [[start, end], ...]}\n"
            "  (the rendered text, and the byte ranges of it the loss covers)\n"
            "       shardlm data encode|decode|tokenizer --tokenizer T ...\n"
            "  text <-> ids on stdin/stdout (shardlm data encode --help)\n"
            "       shardlm data random --vocab V --tokens N [--seed S] OUT.bin\n"
            "  uniform random token ids in [0, V), for benchmarks (width 2 if V <= 65536)\n");
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

/* shardlm data random --vocab V --tokens N [--seed S] OUT.bin */
static int data_random(int argc, char **argv) {
    long long vocab = 0, count = 0;
    uint64_t seed = 1;
    const char *out = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const int number = strcmp(a, "--vocab") == 0 || strcmp(a, "--tokens") == 0 ||
                           strcmp(a, "--seed") == 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: shardlm data random --vocab V --tokens N [--seed S] OUT.bin\n"
                   "  N uniform random token ids in [0, V) (seed S, default 1) as a token file,\n"
                   "  width 2 if V <= 65536: data for benchmarks and tests\n");
            return 0;
        }
        if (number) {
            if (i + 1 >= argc) return cli_fail("data", 2, "%s needs a value", a);
            const char *v = argv[++i];
            char err[320];
            const int rc = a[2] == 'v'   ? num_option_int(a, v, 2, INT32_MAX, &vocab, err, sizeof err)
                           : a[2] == 't' ? num_option_int(a, v, 2, LLONG_MAX, &count, err, sizeof err)
                                         : num_option_u64(a, v, &seed, err, sizeof err);
            if (rc != 0) return cli_fail("data", 2, "%s", err);
        } else if (a[0] == '-') {
            return cli_fail("data", 2, "unknown option '%s'", a);
        } else if (!out) {
            out = a;
        } else {
            return cli_fail("data", 2, "unexpected argument '%s' (takes OUT.bin)", a);
        }
    }
    if (!vocab || !count) return cli_fail("data", 2, "random needs --vocab V and --tokens N");
    if (!out) return cli_fail("data", 2, "random needs OUT.bin");
    char err[1536];
    if (safe_file_check_target(out, err, sizeof err) != 0) return cli_fail("data", 1, "%s", err);
    int32_t *tokens = malloc((size_t)count * sizeof *tokens);
    if (!tokens) return cli_fail("data", 1, "out of memory for %lld tokens", count);
    for (long long i = 0; i < count; i++)
        tokens[i] = (int32_t)(rng_hash64(seed * 0x9E3779B97F4A7C15ull ^ (uint64_t)i) %
                              (uint64_t)vocab);
    int rc = token_file_write(out, tokens, NULL, (uint64_t)count, vocab <= 65536 ? 2 : 4,
                              (uint32_t)vocab, NULL, err, sizeof err);
    free(tokens);
    if (rc != 0) return cli_fail("data", 1, "%s", err);
    printf("wrote %lld random tokens (vocab %lld) to %s\n", count, vocab, out);
    return 0;
}

/* shardlm data info FILE.bin */
static int data_info(int argc, char **argv) {
    if (argc == 3 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
        data_usage(stdout);
        return 0;
    }
    if (argc != 3 || argv[2][0] == '-') return cli_fail("data", 2, "info takes one token file");
    token_file tf;
    char err[1536];
    if (token_file_open(&tf, argv[2], err, sizeof err) != 0) return cli_fail("data", 1, "%s", err);
    const int v2 = tf.version >= 2;
    printf("%-14s %s\n", "file", tf.path);
    printf("%-14s %d\n", "version", tf.version);
    printf("%-14s %d bytes\n", "width", tf.width);
    printf("%-14s %u\n", "vocab", tf.vocab_size);
    printf("%-14s %llu\n", "tokens", (unsigned long long)tf.count);
    printf("%-14s %llu\n", "documents", (unsigned long long)tf.documents);
    printf("%-14s %llu (%.2f%%)\n", "trained", (unsigned long long)tf.trained,
           tf.count ? 100.0 * (double)tf.trained / (double)tf.count : 0.0);
    printf("%-14s %llu tokens\n", "longest", (unsigned long long)tf.longest);
    if (v2) {
        printf("%-14s %llu\n", "truncated", (unsigned long long)tf.meta.truncated);
        printf("%-14s %llu\n", "dropped", (unsigned long long)tf.meta.dropped);
        if (tf.meta.max_doc_len)
            printf("%-14s %llu tokens\n", "max_doc_len", (unsigned long long)tf.meta.max_doc_len);
        else
            printf("%-14s none\n", "max_doc_len");
        printf("%-14s %s\n", "format", token_file_format_name(tf.meta.format));
        printf("%-14s %s\n", "chat_template", token_file_template_name(tf.meta.chat_template));
    } else {
        printf("%-14s unknown (version 1: one document, every token trained)\n", "truncated");
    }
    token_file_close(&tf);
    return 0;
}

/* The options of data prepare and data render. */
typedef struct prep_args {
    const char *tokenizer, *width, *format, *chat_template, *max_doc_len, *overlong;
    const char *paths[2];
    int n_paths;
} prep_args;

/* Parses argv[2..] into a; returns -1 (after printing usage, *status 0) for --help, -2
 * with *status 2 for a usage error (printed). */
static int parse_prep(int argc, char **argv, int render, prep_args *a, int *status) {
    memset(a, 0, sizeof *a);
    static const char *const names[] = {"--tokenizer", "--width", "--format", "--chat-template",
                                        "--max-doc-len", "--overlong"};
    const char **dst[] = {&a->tokenizer, &a->width, &a->format, &a->chat_template,
                          &a->max_doc_len, &a->overlong};
    const int n_opts = render ? 4 : 6;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            data_usage(stdout);
            *status = 0;
            return -1;
        }
        int k = 0;
        size_t len = 0;
        for (; k < n_opts; k++) {
            len = strlen(names[k]);
            if (strncmp(arg, names[k], len) == 0 && (arg[len] == 0 || arg[len] == '=')) break;
        }
        if (k < n_opts && (k != 1 || !render)) {
            if (arg[len] == '=') {
                *dst[k] = arg + len + 1;
            } else if (i + 1 < argc) {
                *dst[k] = argv[++i];
            } else {
                *status = cli_fail("data", 2, "%s needs a value", names[k]);
                return -2;
            }
        } else if (arg[0] == '-' && arg[1] != '\0') {
            *status = cli_fail("data", 2, "unknown option '%s'", arg);
            return -2;
        } else if (a->n_paths < 2 - render) {
            a->paths[a->n_paths++] = arg;
        } else {
            *status = cli_fail("data", 2, "unexpected argument '%s' (%s)", arg,
                               render ? "render takes IN" : "prepare takes IN OUT.bin");
            return -2;
        }
    }
    return 0;
}

static token_file_format format_named(const char *name) {
    for (uint32_t f = TOKEN_FORMAT_TEXT; f < TOKEN_FORMAT_N; f++)
        if (strcmp(name, token_file_format_name(f)) == 0) return (token_file_format)f;
    return TOKEN_FORMAT_OTHER;
}

/* The checked options: the format, the template to use (*use: NULL for none; ct holds
 * it), the document limit. Returns 0, or the exit status after printing the one line. */
static int resolve_prep(const prep_args *a, const tokenizer *tok, prepare_options *o,
                        chat_template *ct) {
    memset(o, 0, sizeof *o);
    o->format = a->format ? format_named(a->format) : TOKEN_FORMAT_TEXT;
    if (o->format == TOKEN_FORMAT_OTHER)
        return cli_fail("data", 2,
                        "--format must be text, jsonl-text, prompt-response or chat, not '%s'",
                        a->format);
    const int templated =
        o->format == TOKEN_FORMAT_PROMPT_RESPONSE || o->format == TOKEN_FORMAT_CHAT;
    if (a->chat_template && !templated)
        return cli_fail("data", 2, "--chat-template applies to --format prompt-response and chat");
    if (a->overlong && !a->max_doc_len)
        return cli_fail("data", 2, "--overlong needs --max-doc-len");
    if (a->overlong && strcmp(a->overlong, "truncate") != 0 && strcmp(a->overlong, "drop") != 0)
        return cli_fail("data", 2, "--overlong must be truncate or drop, not '%s'", a->overlong);
    o->drop_overlong = a->overlong && strcmp(a->overlong, "drop") == 0;
    if (a->max_doc_len) {
        long long v;
        char err[320];
        if (num_option_int("--max-doc-len", a->max_doc_len, 1, LLONG_MAX, &v, err, sizeof err))
            return cli_fail("data", 2, "%s", err);
        o->max_doc_len = (uint64_t)v;
    }
    if (!templated) return 0;
    const char *name = a->chat_template ? a->chat_template : "auto";
    if (strcmp(name, "none") == 0) {
        if (o->format == TOKEN_FORMAT_CHAT)
            return cli_fail("data", 2,
                            "--format chat needs a chat template (auto, chatml, qwen2.5, llama2 or "
                            "llama3)");
        return 0;
    }
    /* auto with a model that has no template: prompt-response pairs become plain
     * documents (the prompt untrained), a chat cannot be rendered */
    if (strcmp(name, "auto") == 0 && !tokenizer_chat_template(tok)) {
        if (o->format == TOKEN_FORMAT_CHAT)
            return cli_fail("data", 1,
                            "%s has no chat template: give --chat-template chatml, qwen2.5, llama2 or "
                            "llama3",
                            tokenizer_path(tok));
        return 0;
    }
    char err[1536];
    if (chat_template_for(ct, tok, name, err, sizeof err) != 0)
        return cli_fail("data", strncmp(err, "unknown chat template", 21) == 0 ? 2 : 1, "%s", err);
    o->tmpl = ct;
    return 0;
}

/* The data render visitor: one JSON line per document. */
static int print_rendered(void *ctx, uint64_t line, const doc_pieces *d, char *err,
                          size_t errlen) {
    cJSON *o = cJSON_CreateObject(), *spans = cJSON_CreateArray();
    cJSON_AddNumberToObject(o, "line", (double)line);
    cJSON_AddStringToObject(o, "text", d->text.data ? d->text.data : "");
    for (size_t k = 0; k < d->n;) {
        if (!d->p[k].trained) {
            k++;
            continue;
        }
        const size_t a = d->p[k].off;
        while (k < d->n && d->p[k].trained) k++;
        const double span[2] = {(double)a, (double)(d->p[k - 1].off + d->p[k - 1].len)};
        cJSON_AddItemToArray(spans, cJSON_CreateDoubleArray(span, 2));
    }
    cJSON_AddItemToObject(o, "trained", spans);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    puts(s);
    free(s);
    return 0;
}

/* What data prepare wrote; overlong and untrained documents as warnings. */
static void print_prepared(const prep_args *a, const prepare_options *o, const prepared *p,
                           uint32_t vocab) {
    const uint64_t docs = p->records - p->dropped;
    uint64_t trained = 0;
    for (size_t i = 0; i < p->ids.n; i++) trained += p->flags.data[i] & TOKEN_TRAINED;
    printf("wrote %zu tokens in %llu documents (%llu trained, %.1f%%) to %s: vocab %u, format "
           "%s, chat template %s\n", p->ids.n, (unsigned long long)docs,
           (unsigned long long)trained, p->ids.n ? 100.0 * (double)trained / (double)p->ids.n : 0.0,
           a->paths[1], vocab, token_file_format_name(o->format),
           o->tmpl ? o->tmpl->source : "none");
    if (p->truncated || p->dropped)
        fprintf(stderr, "shardlm: warning: data: %s: %llu of %llu documents were longer than "
                "--max-doc-len %llu tokens and %s (the first at line %llu; the longest, %llu "
                "tokens, at line %llu)\n", a->paths[0],
                (unsigned long long)(p->truncated + p->dropped), (unsigned long long)p->records,
                (unsigned long long)o->max_doc_len,
                o->drop_overlong ? "were dropped" : "were truncated to it",
                (unsigned long long)p->overlong_first_line,
                (unsigned long long)p->overlong_longest,
                (unsigned long long)p->overlong_longest_line);
    if (p->untrained)
        fprintf(stderr, "shardlm: warning: data: %s: %llu documents have no trained token (the "
                "first at line %llu): they cost compute and train nothing\n", a->paths[0],
                (unsigned long long)p->untrained, (unsigned long long)p->untrained_first_line);
}

/* data prepare and data render: everything up to the input's documents. */
static int data_prepare(int argc, char **argv, int render) {
    prep_args a;
    int status = 0;
    if (parse_prep(argc, argv, render, &a, &status) != 0) return status;
    if (!a.tokenizer)
        return cli_fail("data", 2,
                        "--tokenizer is required (a tokenizer file, a model directory, or bytes)");
    int width = !a.width ? 0 : strcmp(a.width, "2") == 0 ? 2 : strcmp(a.width, "4") == 0 ? 4 : -1;
    if (width < 0) return cli_fail("data", 2, "--width must be 2 or 4, not '%s'", a.width);
    if (a.n_paths != 2 - render)
        return cli_fail("data", 2, render ? "render needs IN" : "prepare needs IN and OUT.bin");
    /* the output replaces its name: were it the input (by any path or link), the text
     * would be gone */
    if (!render && safe_file_same(a.paths[0], a.paths[1]))
        return cli_fail("data", 1,
                        "%s is the input file %s itself (same file): refusing to replace the "
                        "text with its tokens; choose another OUT.bin",
                        a.paths[1], a.paths[0]);
    char err[1536];
    /* what the output would replace, before the work (token_file_write checks it again) */
    if (!render && safe_file_check_target(a.paths[1], err, sizeof err) != 0)
        return cli_fail("data", 1, "%s", err);
    struct tokenizer *tok;
    if (tokenizer_open(&tok, a.tokenizer, err, sizeof err) != 0)
        return cli_fail("data", 1, "%s", err);
    prepare_options o;
    chat_template ct = {0};
    int rc = resolve_prep(&a, tok, &o, &ct);
    uint32_t vocab = tokenizer_vocab_size(tok);
    if (!width) width = vocab <= 65536 ? 2 : 4;
    if (rc == 0 && width == 2 && vocab > 65536)
        rc = cli_fail("data", 2, "--width 2 cannot hold the ids of %s (vocab %u > 65536)",
                      a.tokenizer, vocab);
    size_t n = 0;
    unsigned char *text = rc == 0 ? read_all(a.paths[0], &n) : NULL;
    if (rc == 0 && !text)
        rc = cli_fail("data", 1, "%s: cannot read: %s", a.paths[0], strerror(errno));
    if (rc == 0 && n == 0)
        rc = cli_fail("data", 1, "%s: empty file, nothing to tokenize", a.paths[0]);
    prepared p = {0};
    if (rc == 0 && render &&
        prepare_records(tok, &o, a.paths[0], (const char *)text, n, print_rendered, NULL, err,
                        sizeof err) != 0)
        rc = cli_fail("data", 1, "%s", err);
    if (rc == 0 && !render &&
        prepare_file(tok, &o, a.paths[0], (const char *)text, n, &p, err, sizeof err) != 0)
        rc = cli_fail("data", 1, "%s", err);
    free(text);
    tokenizer_free(tok);
    const token_file_meta meta = {.truncated = p.truncated, .dropped = p.dropped,
                                  .max_doc_len = o.max_doc_len, .format = o.format,
                                  .chat_template = !o.tmpl ? TOKEN_TEMPLATE_NONE
                                                   : o.tmpl->format == CHAT_CHATML
                                                       ? TOKEN_TEMPLATE_CHATML
                                                   : o.tmpl->format == CHAT_LLAMA2
                                                       ? TOKEN_TEMPLATE_LLAMA2
                                                       : TOKEN_TEMPLATE_LLAMA3};
    if (rc == 0 && !render &&
        token_file_write(a.paths[1], p.ids.ids, (const uint8_t *)p.flags.data, p.ids.n, width,
                         vocab, &meta, err, sizeof err) != 0)
        rc = cli_fail("data", 1, "%s", err);
    if (rc == 0 && !render) print_prepared(&a, &o, &p, vocab);
    chat_template_free(&ct);
    prepared_free(&p);
    return rc;
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
    if (strcmp(argv[1], "info") == 0) return data_info(argc, argv);
    if (strcmp(argv[1], "prepare") == 0) return data_prepare(argc, argv, 0);
    if (strcmp(argv[1], "render") == 0) return data_prepare(argc, argv, 1);
    return cli_fail("data", 2, "unknown subcommand '%s' (try: shardlm data --help)", argv[1]);
}
