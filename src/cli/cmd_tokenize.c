/* `shardlm data encode|decode|tokenizer --tokenizer T`: text <-> ids on stdin/stdout with
 * any tokenizer (src/tokenizer/tokenizer.h), for debugging a model's tokenizer and for the tests that
 * compare it with the reference libraries. A plain process: no MPI. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/errmsg.h"
#include "src/cli/cli_fail.h"
#include "src/cli/commands.h"
#include "src/tokenizer/tokenizer.h"

static void tokenize_usage(FILE *out) {
    fprintf(out,
            "usage: shardlm data encode --tokenizer T [--bos] [--eos] [--add-special] [--lines]\n"
            "         text on stdin -> token ids on stdout, space-separated, one line\n"
            "         --bos, --eos     add bos / eos; --add-special: as the model's config says\n"
            "         --lines          each input line alone, one output line per input line\n"
            "       shardlm data decode --tokenizer T [--skip-special] [--stream] [--lines]\n"
            "         token ids on stdin (separated by blanks or commas) -> text on stdout\n"
            "         --skip-special   leave special tokens out; --stream: one token at a time\n"
            "         --lines          each input line of ids alone, one text line for each\n"
            "       shardlm data tokenizer --tokenizer T\n"
            "         what the tokenizer is: kind, file, vocab size, bos/eos/pad, template\n"
            "  T: a tokenizer.model or tokenizer.json file, a model directory holding one, or\n"
            "     'bytes' (id = byte value, vocab 256)\n");
}

/* All of stdin into b (NUL-terminated); -1 on a read error or out of memory. */
static int read_stdin(byte_buf *b) {
    char chunk[1 << 16];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, stdin)) > 0)
        if (byte_buf_append(b, chunk, got) != 0) return -1;
    return ferror(stdin) || byte_buf_append(b, NULL, 0) != 0 ? -1 : 0;
}

typedef struct options {
    const char *tokenizer;
    int bos, eos, add_special, lines, skip_special, stream;
} options;

/* Parses the options of `data SUB`; returns -1 after printing usage (*status set). */
static int parse(int argc, char **argv, int decode, options *o, int *status) {
    memset(o, 0, sizeof *o);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int *on = decode < 2 && !strcmp(a, "--lines")           ? &o->lines
                  : !decode && !strcmp(a, "--bos")               ? &o->bos
                  : !decode && !strcmp(a, "--eos")               ? &o->eos
                  : !decode && !strcmp(a, "--add-special")       ? &o->add_special
                  : decode == 1 && !strcmp(a, "--skip-special") ? &o->skip_special
                  : decode == 1 && !strcmp(a, "--stream")       ? &o->stream
                                                                 : NULL;
        if (on) {
            *on = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tokenize_usage(stdout);
            *status = 0;
            return -1;
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            o->tokenizer = argv[++i];
        } else if (!strncmp(a, "--tokenizer=", 12)) {
            o->tokenizer = a + 12;
        } else {
            *status = cli_fail("data", 2,
                               "%s: unexpected argument '%s' (see shardlm data %s --help)",
                               argv[1], a, argv[1]);
            return -1;
        }
    }
    if (!o->tokenizer) {
        *status = cli_fail("data", 2,
                           "%s needs --tokenizer (a tokenizer file, a model directory, or bytes)",
                           argv[1]);
        return -1;
    }
    return 0;
}

/* One line of ids, space-separated (formatted by hand: printf per id costs more than
 * encoding it). */
static int write_ids(const token_ids *ids) {
    char buf[1 << 14];
    size_t n = 0;
    for (size_t i = 0; i < ids->n; i++) {
        if (n > sizeof buf - 16) {
            if (fwrite(buf, 1, n, stdout) != n) return -1;
            n = 0;
        }
        char digits[12];
        int k = 0;
        uint32_t v = (uint32_t)ids->ids[i];
        do digits[k++] = (char)('0' + v % 10); while (v /= 10);
        if (i) buf[n++] = ' ';
        while (k) buf[n++] = digits[--k];
    }
    buf[n++] = '\n';
    return fwrite(buf, 1, n, stdout) == n ? 0 : -1;
}

static int write_out(const char *p, size_t n) {
    return fwrite(p, 1, n, stdout) == n ? 0 : -1;
}

/* What one command does with one unit of input (the whole of stdin, or a line): 0, or -1
 * with the message in err. */
typedef struct unit_ctx {
    tokenizer *t;
    const options *o;
    int flags;
    unsigned long long line; /* of stdin, where the unit starts */
    token_ids ids;
    byte_buf text;
    char err[1536];
} unit_ctx;
typedef int (*unit_fn)(unit_ctx *u, const char *in, size_t n);

/* The commands' common frame: options, the tokenizer, stdin whole or line by line (a last
 * line without '\n' counts), one call of fn per unit, cleanup. */
static int run_units(int argc, char **argv, int mode, unit_fn fn) {
    options o;
    int status;
    if (parse(argc, argv, mode, &o, &status) != 0) return status;
    unit_ctx u = {.o = &o};
    if (tokenizer_open(&u.t, o.tokenizer, u.err, sizeof u.err) != 0)
        return cli_fail("data", 1, "%s", u.err);
    u.flags = mode == 1 ? (o.skip_special ? TOKENIZER_SKIP_SPECIAL : 0)
                        : (o.bos ? TOKENIZER_ADD_BOS : 0) | (o.eos ? TOKENIZER_ADD_EOS : 0) |
                              (o.add_special ? tokenizer_default_flags(u.t) : 0);
    byte_buf in = {0};
    int rc = 0;
    if (read_stdin(&in) != 0) {
        rc = cli_fail("data", 1, "%s: cannot read stdin: %s", argv[1], strerror(errno));
    } else {
        size_t at = 0;
        u.line = 1;
        do {
            const char *nl = o.lines ? memchr(in.data + at, '\n', in.n - at) : NULL;
            size_t end = nl ? (size_t)(nl - in.data) : in.n;
            if (fn(&u, in.data + at, end - at) != 0) {
                rc = cli_fail("data", 1, "%s: %s", argv[1], u.err);
                break;
            }
            at = end + 1;
            u.line++;
        } while (o.lines && at < in.n);
    }
    if (rc == 0 && fflush(stdout) != 0)
        rc = cli_fail("data", 1, "%s: cannot write stdout", argv[1]);
    free(in.data);
    free(u.ids.ids);
    free(u.text.data);
    tokenizer_free(u.t);
    return rc;
}

static int encode_unit(unit_ctx *u, const char *in, size_t n) {
    u->ids.n = 0;
    char why[1024];
    if (tokenizer_encode_with(u->t, in, n, u->flags, &u->ids, why, sizeof why) != 0) {
        const size_t off = tokenizer_error_offset(u->t);
        unsigned long long line;
        size_t byte;
        if (off == (size_t)-1) {
            snprintf(u->err, sizeof u->err, "stdin:%llu: %s", u->line, why);
        } else {
            io_text_position(in, off, &line, &byte);
            snprintf(u->err, sizeof u->err, "stdin:%llu: %s " IO_AT_BYTE, u->line + line - 1,
                     why, byte);
        }
        return -1;
    }
    if (write_ids(&u->ids) != 0) {
        snprintf(u->err, sizeof u->err, "cannot write stdout: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* shardlm data encode */
int cmd_data_encode(int argc, char **argv) { return run_units(argc, argv, 0, encode_unit); }

/* The ids of text[0, n) (stdin from line `line` on): integers separated by blanks or
 * commas. */
static int parse_ids(const char *text, size_t n, unsigned long long line, token_ids *ids,
                     char *err, size_t errlen) {
    size_t i = 0;
    while (i < n) {
        if (strchr(" \t\r\n,", text[i])) {
            i++;
            continue;
        }
        char digits[16];
        size_t k = 0;
        while (i + k < n && !strchr(" \t\r\n,", text[i + k]) && k < sizeof digits - 1) {
            digits[k] = text[i + k];
            k++;
        }
        digits[k] = '\0';
        char *end;
        errno = 0;
        long v = strtol(digits, &end, 10);
        if (*end || errno || v < 0 || v > INT32_MAX ||
            (i + k < n && !strchr(" \t\r\n,", text[i + k]))) {
            unsigned long long at_line;
            size_t at_byte;
            io_text_position(text, i, &at_line, &at_byte);
            snprintf(err, errlen, "stdin:%llu: '%.15s' is not a token id " IO_AT_BYTE,
                     line + at_line - 1, digits, at_byte);
            return -1;
        }
        if (token_ids_push(ids, (int32_t)v) != 0) {
            snprintf(err, errlen, "stdin: out of memory");
            return -1;
        }
        i += k;
    }
    return 0;
}

/* Decodes one unit of ids to stdout, whole or one token at a time through the
 * incremental decoder. */
static int decode_unit(unit_ctx *u, const char *in, size_t n) {
    u->ids.n = 0;
    if (parse_ids(in, n, u->line, &u->ids, u->err, sizeof u->err) != 0) return -1;
    int rc = 0;
    tokenizer_stream s;
    tokenizer_stream_init(&s, u->flags);
    for (size_t i = 0; i <= u->ids.n && rc == 0; i++) {
        u->text.n = 0;
        if (!u->o->stream)
            rc = i == 0 ? tokenizer_decode(u->t, u->ids.ids, u->ids.n, u->flags, &u->text, u->err,
                                           sizeof u->err)
                        : 0;
        else if (i < u->ids.n)
            rc = tokenizer_stream_push(u->t, &s, u->ids.ids[i], &u->text, u->err, sizeof u->err);
        else
            rc = tokenizer_stream_flush(u->t, &s, &u->text, u->err, sizeof u->err);
        if (rc == 0 && (write_out(u->text.data, u->text.n) != 0 ||
                        (u->o->stream && fflush(stdout) != 0))) {
            snprintf(u->err, sizeof u->err, "cannot write stdout: %s", strerror(errno));
            rc = -1;
        }
    }
    tokenizer_stream_free(&s);
    if (rc == 0 && u->o->lines && putchar('\n') == EOF) {
        snprintf(u->err, sizeof u->err, "cannot write stdout: %s", strerror(errno));
        rc = -1;
    }
    return rc;
}

/* shardlm data decode */
int cmd_data_decode(int argc, char **argv) { return run_units(argc, argv, 1, decode_unit); }

static void print_token(const tokenizer *t, const char *what, int32_t id) {
    const char *s = id >= 0 ? tokenizer_token_string(t, id) : NULL;
    if (id < 0)
        printf("%-12s none\n", what);
    else
        printf("%-12s %ld %s\n", what, (long)id, s ? s : "");
}

/* shardlm data tokenizer */
int cmd_data_tokenizer(int argc, char **argv) {
    options o;
    int status;
    if (parse(argc, argv, 2, &o, &status) != 0) return status;
    char err[1536];
    tokenizer *t;
    if (tokenizer_open(&t, o.tokenizer, err, sizeof err) != 0)
        return cli_fail("data", 1, "%s", err);
    printf("%-12s %s\n%-12s %s\n%-12s %s\n%-12s %u\n", "kind", tokenizer_kind(t), "file",
           tokenizer_path(t), "encoder", tokenizer_encoder(t), "vocab_size",
           tokenizer_vocab_size(t));
    print_token(t, "bos", tokenizer_bos(t));
    print_token(t, "eos", tokenizer_eos(t));
    print_token(t, "pad", tokenizer_pad(t));
    int n;
    const int32_t *eos = tokenizer_eos_ids(t, &n);
    printf("%-12s", "eos_ids");
    for (int i = 0; i < n; i++) printf(" %ld", (long)eos[i]);
    printf("%s\n%-12s %s\n%-12s %s\n", n ? "" : " none", "add_bos",
           tokenizer_add_bos(t) ? "true" : "false", "add_eos",
           tokenizer_add_eos(t) ? "true" : "false");
    const char *tmpl = tokenizer_chat_template(t);
    if (tmpl)
        printf("%-12s %zu bytes\n", "chat_template", strlen(tmpl));
    else
        printf("%-12s none\n", "chat_template");
    tokenizer_free(t);
    return fflush(stdout) == 0 ? 0 : cli_fail("data", 1, "tokenizer: cannot write stdout");
}
