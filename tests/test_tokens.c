/* Tests of token data files (io/tokens.c) and `shardlm data prepare` (src/cli/cmd_data.c):
 * round trips, every validation error naming the file, and garbage that must not crash. */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/tokens.h"
#include "src/cli/commands.h"
#include "src/data/data_loader.h"
#include "src/base/rng.h"

#include "tests/check.h"

static char dir[256];

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = malloc(1 << 20);
    *n = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

static void put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A header's first 32 bytes (all of version 1's), fields given explicitly; a version-2
 * header's other bytes are zero. */
static void make_header(unsigned char *h, uint32_t version, uint32_t width, uint64_t count,
                        uint32_t vocab) {
    memset(h, 0, TOKENS_HEADER_BYTES);
    memcpy(h, TOKENS_MAGIC, 8);
    for (int i = 0; i < 4; i++) h[8 + i] = (unsigned char)(version >> (8 * i));
    for (int i = 0; i < 4; i++) h[12 + i] = (unsigned char)(width >> (8 * i));
    for (int i = 0; i < 8; i++) h[16 + i] = (unsigned char)(count >> (8 * i));
    for (int i = 0; i < 4; i++) h[24 + i] = (unsigned char)(vocab >> (8 * i));
}

/* Opens a file expected to be rejected; checks the message names the file and contains
 * `problem`. */
static void expect_open_error(const char *path, const char *problem, const char *what) {
    token_file tf;
    char err[1024] = "";
    int rc = token_file_open(&tf, path, err, sizeof err);
    check(rc == -1 && strstr(err, path) == err && strstr(err, problem) && !strchr(err, '\n'),
          "%s: rc %d, message \"%s\" (want the path, then \"%s\")", what, rc, err, problem);
}

static void test_round_trip(int width, uint32_t vocab, uint64_t n) {
    int32_t *tok = malloc(n * sizeof *tok);
    for (uint64_t i = 0; i < n; i++) tok[i] = (int32_t)(rng_hash64(i) % vocab);
    tok[0] = 0;
    tok[n - 1] = (int32_t)vocab - 1; /* both ends of the id range */
    const char *path = tmp_path("round.bin");
    char err[1024] = "";
    int rc = token_file_write(path, tok, NULL, n, width, vocab, NULL, err, sizeof err);
    check(rc == 0, "write %llu tokens width %d vocab %u: rc %d %s", (unsigned long long)n,
          width, vocab, rc, err);
    struct stat sb;
    size_t bytes = stat(path, &sb) == 0 ? (size_t)sb.st_size : 0;
    const size_t want = TOKENS_HEADER_BYTES + (n * width + 7) / 8 * 8 + 16 * ((n + 63) / 64);
    check(bytes == want, "file size %zu = 96 + %llu x %d (to 8 bytes) + 16 x %llu groups", bytes,
          (unsigned long long)n, width, (unsigned long long)((n + 63) / 64));
    token_file tf;
    rc = token_file_open(&tf, path, err, sizeof err);
    check(rc == 0 && tf.version == 2 && tf.width == width && tf.count == n &&
              tf.vocab_size == vocab && strcmp(tf.path, path) == 0 && tf.documents == 1 &&
              tf.trained == n && tf.longest == n,
          "reopen: rc %d width %d count %llu vocab %u, one document trained throughout %s", rc,
          tf.width, (unsigned long long)tf.count, tf.vocab_size, err);
    int32_t *back = malloc(n * sizeof *back);
    int same = rc == 0 && token_file_read(&tf, 0, n, back, err, sizeof err) == 0;
    for (uint64_t i = 0; same && i < n; i++) same = back[i] == tok[i];
    check(same, "width %d: tokens read back equal tokens written %s", width, err);
    /* a window in the middle, and the range check */
    same = rc == 0 && n > 10 && token_file_read(&tf, n / 2, 5, back, err, sizeof err) == 0 &&
           memcmp(back, tok + n / 2, 5 * sizeof *back) == 0;
    check(same, "width %d: tokens [n/2, n/2+5) read back %s", width, err);
    check(rc == 0 && token_file_read(&tf, n - 1, 2, back, err, sizeof err) == -1 &&
              strstr(err, "the file holds"),
          "width %d: a read past the count is refused: %s", width, err);
    if (rc == 0) token_file_close(&tf);
    free(back);
    free(tok);
}

/* Version 1 files (32-byte header, ids only) still read: every token trained, one
 * document starting at token 0. */
static void test_v1_reads(void) {
    enum { N = 300 };
    unsigned char buf[TOKENS_HEADER_V1_BYTES + 2 * N];
    make_header(buf, 1, 2, N, 1000);
    for (int i = 0; i < N; i++) put_le(buf + TOKENS_HEADER_V1_BYTES + 2 * i, (uint64_t)(i * 3), 2);
    const char *p = tmp_path("v1.bin");
    write_bytes(p, buf, sizeof buf);
    token_file tf;
    char err[1024] = "";
    int rc = token_file_open(&tf, p, err, sizeof err);
    check(rc == 0 && tf.version == 1 && tf.count == N && tf.documents == 1 && tf.trained == N &&
              tf.longest == N,
          "version 1 opens: one document of %d, all trained (rc %d %s)", N, rc, err);
    if (rc != 0) return;
    int32_t ids[10];
    uint8_t fl[10];
    int ok = token_file_read(&tf, 100, 10, ids, err, sizeof err) == 0 &&
             token_file_read_flags(&tf, 0, 10, fl, err, sizeof err) == 0;
    for (int i = 0; ok && i < 10; i++)
        ok = ids[i] == (100 + i) * 3 && fl[i] == (i == 0 ? TOKEN_TRAINED | TOKEN_DOC_START
                                                         : TOKEN_TRAINED);
    ok = ok && token_file_read_flags(&tf, 200, 10, fl, err, sizeof err) == 0;
    for (int i = 0; ok && i < 10; i++) ok = fl[i] == TOKEN_TRAINED;
    check(ok, "version 1: ids read, flags trained throughout, doc start at 0 only %s", err);
    token_file_close(&tf);
}

/* Documents of random lengths and masks: the flags of every range read back (ranges
 * crossing bit groups and read chunks), the header's counts, data info's view. */
static void test_flags_round_trip(uint64_t n) {
    int32_t *tok = malloc(n * sizeof *tok);
    uint8_t *fl = malloc(n), *back = malloc(n);
    uint64_t docs = 0, trained = 0, longest = 0, start = 0;
    for (uint64_t i = 0; i < n; i++) {
        tok[i] = (int32_t)(rng_hash64(i) % 500);
        const int doc = i == 0 || rng_hash64(i ^ 0xd0c) % 97 == 0;
        if (doc && i > 0 && i - start > longest) longest = i - start;
        if (doc) start = i, docs++;
        fl[i] = (uint8_t)((doc ? TOKEN_DOC_START : 0) | (rng_hash64(i ^ 0x7) % 3 ? TOKEN_TRAINED : 0));
        trained += fl[i] & TOKEN_TRAINED;
    }
    if (n - start > longest) longest = n - start;
    const char *p = tmp_path("flags.bin");
    char err[1024] = "";
    const token_file_meta meta = {.truncated = 2, .dropped = 5, .max_doc_len = longest,
                                  .format = TOKEN_FORMAT_CHAT,
                                  .chat_template = TOKEN_TEMPLATE_LLAMA2};
    int rc = token_file_write(p, tok, fl, n, 2, 500, &meta, err, sizeof err);
    token_file tf;
    rc = rc == 0 ? token_file_open(&tf, p, err, sizeof err) : rc;
    check(rc == 0 && tf.documents == docs && tf.trained == trained && tf.longest == longest &&
              tf.meta.truncated == 2 && tf.meta.dropped == 5 && tf.meta.max_doc_len == longest &&
              tf.meta.format == TOKEN_FORMAT_CHAT && tf.meta.chat_template == TOKEN_TEMPLATE_LLAMA2,
          "%llu tokens, %llu documents: header counts %llu/%llu/%llu (want %llu/%llu/%llu) and "
          "metadata read back %s", (unsigned long long)n, (unsigned long long)docs,
          (unsigned long long)tf.documents, (unsigned long long)tf.trained,
          (unsigned long long)tf.longest, (unsigned long long)docs, (unsigned long long)trained,
          (unsigned long long)longest, err);
    if (rc != 0) goto out;
    int ok = token_file_read_flags(&tf, 0, n, back, err, sizeof err) == 0 &&
             memcmp(back, fl, n) == 0;
    for (int k = 0; ok && k < 200; k++) {
        const uint64_t a = rng_hash64(k + 17) % n, len = 1 + rng_hash64(k + 91) % (n - a < 9000 ? n - a : 9000);
        ok = token_file_read_flags(&tf, a, len, back, err, sizeof err) == 0 &&
             memcmp(back, fl + a, len) == 0;
    }
    check(ok, "%llu tokens: the flags of the whole file and of 200 ranges read back %s",
          (unsigned long long)n, err);
    token_file_close(&tf);
out:
    free(tok);
    free(fl);
    free(back);
}

/* Edits byte `at` of a valid version-2 file (99 tokens, three documents) to v, or cuts
 * the file to `size` bytes (at < 0), and expects open to fail naming `problem`. */
static void expect_v2_damage(long at, unsigned char v, size_t size, const char *problem) {
    enum { N = 99 };
    int32_t tok[N];
    uint8_t fl[N];
    for (int i = 0; i < N; i++) {
        tok[i] = i;
        fl[i] = (uint8_t)((i == 0 || i == 30 || i == 70 ? TOKEN_DOC_START : 0) |
                          (i % 2 ? TOKEN_TRAINED : 0));
    }
    const char *p = tmp_path("damaged.bin");
    char err[1024] = "";
    if (token_file_write(p, tok, fl, N, 2, 128, NULL, err, sizeof err) != 0) {
        check(0, "set-up: %s", err);
        return;
    }
    size_t n = 0;
    unsigned char *b = read_bytes(p, &n);
    if (at >= 0) b[at] = v;
    else n = size;
    write_bytes(p, b, n);
    free(b);
    char what[160];
    snprintf(what, sizeof what, "version 2, byte %ld = 0x%02x / size %zu", at, v, n);
    expect_open_error(p, problem, what);
}

static void test_v2_damage(void) {
    /* 99 tokens (documents at 0, 30, 70; odd tokens trained): ids at 96..293, two bytes of
     * padding, then the groups: group 0's mask at 296..303, doc bits at 304..311; group
     * 1's at 312..319 and 320..327 (token 99, past the end, is bit 35: byte 316, 0x08) */
    expect_v2_damage(32, 4, 0, "the header says 4 documents, the bits say 3");
    expect_v2_damage(40, 48, 0, "the header says 48 trained tokens, the bits say 49");
    expect_v2_damage(48, 41, 0, "the header says 41 longest document, the bits say 40");
    expect_v2_damage(294, 1, 0, "non-zero padding between the ids and the bits");
    expect_v2_damage(304, 0x00, 0, "token 0 does not start a document");
    expect_v2_damage(316, 0x0a, 0, "bits set past the last token (99)");
    expect_v2_damage(88, 1, 0, "reserved header bytes are not zero");
    expect_v2_damage(80, 9, 0, "unknown source format 9");
    expect_v2_damage(56, 9, 0, "truncated count 9 or max_doc_len 0 does not fit");
    expect_v2_damage(-1, 0, 320, "truncated: header says 99 tokens, which with their bits take "
                                 "232 bytes after the header; the file has 224");
    /* and the writer refuses flags it could not write back */
    int32_t tok[3] = {1, 2, 3};
    const uint8_t no_start[3] = {TOKEN_TRAINED, 0, 0}, odd[3] = {TOKEN_DOC_START, 8, 0};
    char err[1024] = "";
    const char *w = tmp_path("refused-flags.bin");
    int rc = token_file_write(w, tok, no_start, 3, 2, 4, NULL, err, sizeof err);
    check(rc == -1 && strstr(err, "token 0 must start a document") && access(w, F_OK) != 0,
          "write with token 0 not starting a document refused, no file: %s", err);
    rc = token_file_write(w, tok, odd, 3, 2, 4, NULL, err, sizeof err);
    check(rc == -1 && strstr(err, "token 1 has flags 0x8") && access(w, F_OK) != 0,
          "write with an unknown flag refused: %s", err);
}

/* Opens `path` (tokens 0..n-1 of width 2, vocab 1000), then `change` alters the file:
 * token_file_check must say so naming the file and `problem`, and so must a data-loader
 * batch, whose rows are then all zero. When `read_problem` is given, reading tokens
 * [n/2, n) must fail with it too (no signal: the file is read, not mapped). */
static void expect_change(const char *what, void (*change)(const char *path), const char *problem,
                          const char *read_problem) {
    enum { N = 4000, T = 16 };
    static int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = i % 1000;
    const char *path = tmp_path("changing.bin");
    char err[1024] = "";
    token_file tf;
    if (token_file_write(path, tok, NULL, N, 2, 1000, NULL, err, sizeof err) != 0 ||
        token_file_open(&tf, path, err, sizeof err) != 0) {
        check(0, "%s: set-up: %s", what, err);
        return;
    }
    data_loader dl;
    int32_t in[2 * T], tg[2 * T];
    int rc = data_loader_init(&dl, &tf, T, 1, 7, 0, 1, 2, err, sizeof err);
    rc = rc == 0 ? data_loader_batch(&dl, 0, 0, in, tg, NULL, err, sizeof err) : rc;
    check(rc == 0 && token_file_check(&tf, err, sizeof err) == 0,
          "%s: the file as opened passes the check %s", what, err);
    change(path);
    err[0] = '\0';
    rc = token_file_check(&tf, err, sizeof err);
    check(rc == -1 && strstr(err, path) == err && strstr(err, problem) && !strchr(err, '\n'),
          "%s: check fails naming the file and \"%s\": %s", what, problem, err);
    err[0] = '\0';
    memset(in, 0x5a, sizeof in);
    rc = data_loader_batch(&dl, 0, 1, in, tg, NULL, err, sizeof err);
    int zero = 1;
    for (int i = 0; i < 2 * T; i++) zero = zero && in[i] == 0 && tg[i] == 0;
    check(rc == -1 && strstr(err, path) && strstr(err, problem) && zero,
          "%s: the next batch fails with the same message, rows zero: %s", what, err);
    if (read_problem) {
        static int32_t back[N];
        err[0] = '\0';
        rc = token_file_read(&tf, N / 2, N / 2, back, err, sizeof err);
        check(rc == -1 && strstr(err, path) == err && strstr(err, read_problem),
              "%s: a read fails with \"%s\": %s", what, read_problem, err);
    }
    data_loader_free(&dl);
    token_file_close(&tf);
    remove(path);
}

static void truncate_half(const char *path) {
    if (truncate(path, TOKENS_HEADER_BYTES + 2000) != 0) perror(path);
}

static void replace_by_rename(const char *path) {
    int32_t t[4000] = {0};
    char err[1024], other[600];
    snprintf(other, sizeof other, "%s.new", path);
    if (token_file_write(other, t, NULL, 4000, 2, 1000, NULL, err, sizeof err) != 0 ||
        rename(other, path) != 0)
        printf("     replace: %s\n", err);
}

/* same size, one id out of range, and an mtime that surely differs (a coarse clock could
 * give the write the time of the open) */
static void rewrite_in_place(const char *path) {
    int fd = open(path, O_WRONLY);
    unsigned char big[2] = {0xff, 0xff};
    if (fd < 0 || pwrite(fd, big, 2, TOKENS_HEADER_BYTES + 2 * 3999) != 2) perror(path);
    struct timespec times[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = 1000000000}};
    if (fd >= 0 && futimens(fd, times) != 0) perror(path);
    if (fd >= 0) close(fd);
}

static void remove_file(const char *path) { remove(path); }

static void test_changed_file(void) {
    expect_change("truncated", truncate_half, "changed size", "truncated after it was opened");
    expect_change("replaced by rename", replace_by_rename, "was replaced during the run", NULL);
    expect_change("rewritten in place", rewrite_in_place, "was modified during the run",
                  "token 65535 at index 3999 is >= vocab_size 1000 (the file changed");
    expect_change("removed", remove_file, "removed or renamed", NULL);
}

/* Runs cmd_data with stderr captured into `msg`; returns its status. */
static int run_cmd_data(char *msg, size_t msglen, int argc, ...) {
    char *argv[16];
    va_list ap;
    va_start(ap, argc);
    for (int i = 0; i < argc; i++) argv[i] = va_arg(ap, char *);
    va_end(ap);
    argv[argc] = NULL;
    const char *cap = tmp_path("stderr.txt");
    fflush(stderr);
    int saved = dup(2);
    int fd = open(cap, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
    int rc = cmd_data(argc, argv);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    size_t n = 0;
    unsigned char *text = read_bytes(cap, &n);
    n = n < msglen - 1 ? n : msglen - 1;
    while (n > 0 && text[n - 1] == '\n') n--; /* compared and printed without it */
    memcpy(msg, text, n);
    msg[n] = '\0';
    free(text);
    return rc;
}

static void test_cmd_data(void) {
    const char *txt = tmp_path("in.txt");
    const char *text = "To be, or not to be\xe2\x80\x94that is the question.\n";
    write_bytes(txt, text, strlen(text));
    char out[512], msg[1024];
    snprintf(out, sizeof out, "%s", tmp_path("out.bin"));
    fflush(stdout);
    int rc = run_cmd_data(msg, sizeof msg, 6, "data", "prepare", "--tokenizer", "bytes",
                          (char *)txt, out);
    token_file tf;
    char err[1024] = "";
    int orc = token_file_open(&tf, out, err, sizeof err);
    int same = orc == 0 && tf.count == strlen(text) && tf.vocab_size == 256 && tf.width == 2;
    int32_t back[64];
    same = same && token_file_read(&tf, 0, tf.count, back, err, sizeof err) == 0;
    for (size_t i = 0; same && i < tf.count; i++) same = back[i] == (unsigned char)text[i];
    check(rc == 0 && same, "data prepare --tokenizer bytes: rc %d, file holds the bytes %s",
          rc, err);
    if (orc == 0) token_file_close(&tf);

    rc = run_cmd_data(msg, sizeof msg, 7, "data", "prepare", "--tokenizer=bytes", "--width",
                      "4", (char *)txt, out);
    orc = token_file_open(&tf, out, err, sizeof err);
    check(rc == 0 && orc == 0 && tf.width == 4, "data prepare --width 4: rc %d width %d", rc,
          orc == 0 ? tf.width : -1);
    if (orc == 0) token_file_close(&tf);

    rc = run_cmd_data(msg, sizeof msg, 6, "data", "prepare", "--tokenizer", "sentencepiece",
                      (char *)txt, out);
    check(rc == 1 && strstr(msg, "sentencepiece: no such tokenizer") &&
              !strchr(msg, '\n'),
          "unknown tokenizer: rc %d, one line: %s", rc, msg);
    rc = run_cmd_data(msg, sizeof msg, 8, "data", "prepare", "--tokenizer", "bytes", "--width",
                      "3", (char *)txt, out);
    check(rc == 2 && strstr(msg, "--width must be 2 or 4"), "--width 3: rc %d: %s", rc, msg);
    rc = run_cmd_data(msg, sizeof msg, 5, "data", "prepare", "--tokenizer", "bytes",
                      (char *)txt);
    check(rc == 2 && strstr(msg, "IN and OUT.bin"), "one path: rc %d: %s", rc, msg);
    rc = run_cmd_data(msg, sizeof msg, 5, "data", "prepare", "--frobnicate", (char *)txt, out);
    check(rc == 2 && strstr(msg, "unknown option '--frobnicate'"), "bad flag: rc %d: %s", rc,
          msg);
    rc = run_cmd_data(msg, sizeof msg, 4, "data", "prepare", (char *)txt, out);
    check(rc == 2 && strstr(msg, "--tokenizer is required"), "no tokenizer: rc %d: %s", rc, msg);
    const char *missing = tmp_path("no-such.txt");
    rc = run_cmd_data(msg, sizeof msg, 6, "data", "prepare", "--tokenizer", "bytes",
                      (char *)missing, out);
    check(rc == 1 && strstr(msg, missing) && strstr(msg, "cannot read"),
          "unreadable input: rc %d: %s", rc, msg);
    rc = run_cmd_data(msg, sizeof msg, 2, "data", "shuffle");
    check(rc == 2 && strstr(msg, "unknown subcommand 'shuffle'"), "bad subcommand: rc %d: %s",
          rc, msg);
}

int main(int argc, char **argv) {
    char cwd[512];
    printf("# reproduce: cd %s && %s\n", getcwd(cwd, sizeof cwd) ? cwd : ".", argv[0]);
    (void)argc;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/shlm-test-tokens-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }

    test_round_trip(2, 256, 1000);
    test_round_trip(2, 65536, 70001);
    test_round_trip(4, 32000, 5000);
    test_round_trip(4, 1u << 20, 3000000); /* more than one read chunk */
    test_v1_reads();
    test_flags_round_trip(1000);
    test_flags_round_trip(3000001); /* more than one chunk of groups at open */
    test_v2_damage();

    char err[1024];
    token_file tf;
    /* an empty token file is valid (the data loader is what needs enough tokens) */
    int32_t one = 3;
    int rc = token_file_write(tmp_path("empty.bin"), &one, NULL, 0, 2, 4, NULL, err, sizeof err);
    rc = rc == 0 ? token_file_open(&tf, tmp_path("empty.bin"), err, sizeof err) : rc;
    check(rc == 0 && tf.count == 0, "zero tokens: write and open (rc %d %s)", rc, rc ? err : "");
    if (rc == 0) token_file_close(&tf);

    /* writing refuses bad ids and widths, and leaves no file behind */
    int32_t bad[3] = {1, 7, 2};
    const char *w = tmp_path("refused.bin");
    rc = token_file_write(w, bad, NULL, 3, 2, 4, NULL, err, sizeof err);
    check(rc == -1 && strstr(err, w) && strstr(err, "token 7 at index 1") && access(w, F_OK) != 0,
          "write of id 7 with vocab 4 refused, no file: %s", err);
    rc = token_file_write(w, bad, NULL, 3, 3, 256, NULL, err, sizeof err);
    check(rc == -1 && strstr(err, "unsupported token width 3"), "write width 3 refused: %s",
          err);
    rc = token_file_write(tmp_path("no-dir/x.bin"), bad, NULL, 3, 2, 256, NULL, err, sizeof err);
    check(rc == -1 && strstr(err, "no-dir") && strstr(err, "cannot create"),
          "write into a missing directory: %s", err);

    /* wrong magic: a text file */
    const char *p = tmp_path("text.bin");
    write_bytes(p, "hello, this is not a token file at all\n", 39);
    expect_open_error(p, "bad magic (not a shardlm token file)", "text file");
    write_bytes(p, "", 0);
    expect_open_error(p, "empty file", "empty file");
    write_bytes(p, "SHLMTOK\0\1\0", 10);
    expect_open_error(p, "truncated header: 10 of 32 bytes", "header cut short");

    unsigned char buf[TOKENS_HEADER_BYTES + 4000];
    /* truncated body: the header says 1000 tokens, 998 are there */
    make_header(buf, 1, 2, 1000, 256);
    memset(buf + TOKENS_HEADER_V1_BYTES, 0, 2000);
    write_bytes(p, buf, TOKENS_HEADER_V1_BYTES + 1996);
    expect_open_error(p, "truncated: header says 1000 tokens, body holds 998", "truncated body");
    write_bytes(p, buf, TOKENS_HEADER_V1_BYTES + 1997);
    expect_open_error(p, "truncated: header says 1000 tokens, body holds 998 and 1 stray bytes",
                      "truncated mid-token");
    make_header(buf, 1, 2, 999, 256);
    write_bytes(p, buf, TOKENS_HEADER_V1_BYTES + 2000);
    expect_open_error(p, "trailing data: header says 999 tokens, body holds 1000",
                      "trailing data");
    /* a count so large that count x width overflows must not be believed */
    make_header(buf, 1, 4, UINT64_MAX / 2, 256);
    write_bytes(p, buf, TOKENS_HEADER_V1_BYTES + 8);
    expect_open_error(p, "truncated: header says 9223372036854775807 tokens, body holds 2",
                      "absurd count");

    /* id >= vocab: the example of the spec */
    make_header(buf, 1, 2, 2000, 4);
    memset(buf + TOKENS_HEADER_V1_BYTES, 0, 4000);
    buf[TOKENS_HEADER_V1_BYTES + 2 * 1234] = 5;
    write_bytes(p, buf, TOKENS_HEADER_V1_BYTES + 4000);
    expect_open_error(p, "token 5 at index 1234 is >= vocab_size 4", "id >= vocab (width 2)");
    make_header(buf, 1, 4, 1000, 70000);
    memset(buf + TOKENS_HEADER_V1_BYTES, 0, 4000);
    buf[TOKENS_HEADER_V1_BYTES + 4 * 999 + 0] = 0x70; /* 70000 = 0x011170, little-endian */
    buf[TOKENS_HEADER_V1_BYTES + 4 * 999 + 1] = 0x11;
    buf[TOKENS_HEADER_V1_BYTES + 4 * 999 + 2] = 0x01;
    write_bytes(p, buf, TOKENS_HEADER_V1_BYTES + 4000);
    expect_open_error(p, "token 70000 at index 999 is >= vocab_size 70000",
                      "id >= vocab (width 4, last token)");

    make_header(buf, 3, 2, 10, 256);
    write_bytes(p, buf, TOKENS_HEADER_BYTES + 20);
    expect_open_error(p, "unsupported version 3", "version 3");
    make_header(buf, 2, 2, 10, 256);
    write_bytes(p, buf, 50);
    expect_open_error(p, "truncated header: 50 of 96 bytes", "version-2 header cut short");
    make_header(buf, 1, 3, 10, 256);
    write_bytes(p, buf, TOKENS_HEADER_V1_BYTES + 30);
    expect_open_error(p, "unsupported token width 3", "width 3");
    make_header(buf, 1, 2, 10, 0);
    write_bytes(p, buf, TOKENS_HEADER_V1_BYTES + 20);
    expect_open_error(p, "bad vocab size 0", "vocab 0");
    make_header(buf, 1, 2, 10, 100000);
    write_bytes(p, buf, TOKENS_HEADER_V1_BYTES + 20);
    expect_open_error(p, "does not fit 2-byte tokens", "vocab 100000 with width 2");

    expect_open_error(tmp_path("missing.bin"), "cannot open: No such file or directory",
                      "missing file");
    expect_open_error(dir, "cannot read", "a directory");

    /* garbage: random corruptions of a valid file are rejected or read, never crash, and
     * an accepted file always satisfies the header's promises */
    int32_t tok[500];
    uint8_t garbage_flags[500];
    for (int i = 0; i < 500; i++) {
        tok[i] = i % 300;
        garbage_flags[i] = (uint8_t)((i % 7 ? 0 : TOKEN_DOC_START) | (i % 3 ? TOKEN_TRAINED : 0));
    }
    const char *g = tmp_path("garbage.bin");
    int garbage_ok = 1, accepted = 0;
    for (uint64_t trial = 0; trial < 500; trial++) {
        int width = trial % 2 ? 4 : 2;
        token_file_write(g, tok, trial % 3 ? garbage_flags : NULL, 500, width, 300, NULL, err,
                         sizeof err);
        size_t n = 0;
        unsigned char *b = read_bytes(g, &n);
        int flips = 1 + (int)(rng_hash64(trial) % 4);
        for (int f = 0; f < flips; f++) {
            uint64_t r = rng_hash64(trial * 16 + f + 1);
            /* bias towards the header and the bits, where the interesting damage is */
            size_t at = r % 3 == 0 ? (r >> 8) % TOKENS_HEADER_BYTES
                        : r % 3 == 1 ? n - 1 - (r >> 8) % 128 : (r >> 8) % n;
            b[at] = (unsigned char)(r >> 40);
        }
        if (trial % 5 == 0) n = rng_hash64(~trial) % (n + 1);
        write_bytes(g, b, n);
        free(b);
        err[0] = '\0';
        rc = token_file_open(&tf, g, err, sizeof err);
        if (rc == 0) {
            accepted++;
            int32_t *back = malloc((tf.count + 1) * sizeof *back);
            if (token_file_read(&tf, 0, tf.count, back, err, sizeof err) != 0) garbage_ok = 0;
            for (uint64_t i = 0; garbage_ok && i < tf.count; i++)
                if (back[i] < 0 || (uint32_t)back[i] >= tf.vocab_size) garbage_ok = 0;
            free(back);
            if (tf.width != 2 && tf.width != 4) garbage_ok = 0;
            uint8_t *fl = malloc(tf.count + 1);
            uint64_t docs = 0, trained = 0;
            if (token_file_read_flags(&tf, 0, tf.count, fl, err, sizeof err) != 0) garbage_ok = 0;
            for (uint64_t i = 0; garbage_ok && i < tf.count; i++)
                docs += fl[i] >> 1 & 1, trained += fl[i] & TOKEN_TRAINED;
            if (docs != tf.documents || trained != tf.trained) garbage_ok = 0;
            free(fl);
            token_file_close(&tf);
        } else if (rc != -1 || strstr(err, g) != err || strchr(err, '\n')) {
            garbage_ok = 0;
            printf("     garbage trial %llu: rc %d \"%s\"\n", (unsigned long long)trial, rc, err);
        }
    }
    check(garbage_ok, "500 corrupted files: each rejected with a one-line message naming the "
                      "file, or read consistently (%d read)", accepted);

    test_changed_file();
    test_cmd_data();

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
    return check_exit();
}
