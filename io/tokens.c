/* Token data files (see tokens.h for the layout): open with full validation, windows and
 * their loss-mask and document-start bits read with pread and checked against the file as
 * opened, and writes through a temporary name so a crash never leaves a half-written file
 * under OUT. */
#include "io/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safe_file.h"
#include "io/errmsg.h"
#include "io/hash.h"

/* Tokens per fread/fwrite: large enough to stream at disk speed, small enough that the
 * staging buffer is a rounding error next to the tokens themselves. */
enum { TOKENS_CHUNK = 1 << 20 };

/* names and keys read from the file go into messages: one line whatever they hold */
#define set_err io_set_err

/* Little-endian decoding by bytes, so the format is the same on any host. */
static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const unsigned char *p) {
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}
static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Why pread and not a mapping: a mapped file that is truncated under a running job turns
 * the next read of a vanished page into SIGBUS, which no return code can report; a
 * handler would have to own a process-wide signal that Open MPI and CUDA install their
 * own handlers for. pread reports a truncation as a short read, and costs one system call
 * per window (bench_data_loader: benchmarks/RESULTS.md), nothing next to a step. */

/* Reads exactly n bytes at off; returns 0, or -1 with errno set (0 for end of file). */
static int pread_full(int fd, void *buf, size_t n, uint64_t off) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (got == 0) errno = 0;
            return -1;
        }
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

/* Where the ids start and the bit groups start, and the file's size, for n tokens. */
static uint64_t ids_bytes_v2(uint64_t n, int width) {
    return ((uint64_t)n * (uint64_t)width + 7) / 8 * 8;
}
static uint64_t groups_of(uint64_t n) { return (n + TOKENS_GROUP - 1) / TOKENS_GROUP; }

/* The message for a failed pread at token or group `at`. */
static void read_failed(const token_file *tf, const char *what, uint64_t at, int after_open,
                        char *err, size_t errlen) {
    if (errno == 0)
        set_err(err, errlen, "%s: end of file reading the %s of token %llu of %llu: the file "
                "was truncated%s", tf->path, what, (unsigned long long)at,
                (unsigned long long)tf->count, after_open ? " after it was opened" : "");
    else
        set_err(err, errlen, "%s: cannot read the %s of token %llu: %s%s", tf->path, what,
                (unsigned long long)at, strerror(errno),
                after_open ? " (the file changed after it was opened)" : "");
}

static int range_ok(const token_file *tf, uint64_t first, size_t n, char *err, size_t errlen) {
    if (first > tf->count || n > tf->count - first) {
        set_err(err, errlen, "%s: tokens %llu..%llu asked for, the file holds %llu", tf->path,
                (unsigned long long)first, (unsigned long long)(first + n),
                (unsigned long long)tf->count);
        return 0;
    }
    return 1;
}

/* Tokens [first, first + n) into out; `after_open` says whether a failure means the file
 * changed under us (a run) or is simply bad (the validation pass of open). */
static int read_tokens(const token_file *tf, uint64_t first, size_t n, int32_t *out,
                       int after_open, char *err, size_t errlen) {
    const char *changed = after_open ? " (the file changed after it was opened)" : "";
    if (!range_ok(tf, first, n, err, errlen)) return -1;
    if (tf->tokens) {
        memcpy(out, tf->tokens + first, n * sizeof *out);
        return 0;
    }
    const size_t w = (size_t)tf->width;
    unsigned char *raw = (unsigned char *)out; /* the bytes land in out, decoded in place */
    if (pread_full(tf->fd, raw, n * w, tf->ids_offset + first * w) != 0) {
        read_failed(tf, "id", first, after_open, err, errlen);
        return -1;
    }
    /* widen from the last token down: token i's bytes [w·i, w·i + w) are read before
     * out[i] (bytes [4i, 4i + 4)) is written, and nothing below w·i is touched */
    for (size_t i = n; i-- > 0;) {
        const unsigned char *p = raw + i * w;
        uint32_t id = w == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : get_u32(p);
        if (id >= tf->vocab_size) {
            set_err(err, errlen, "%s: token %u at index %llu is >= vocab_size %u%s", tf->path,
                    id, (unsigned long long)(first + i), tf->vocab_size, changed);
            return -1;
        }
        out[i] = (int32_t)id;
    }
    return 0;
}

int token_file_read(const token_file *tf, uint64_t first, size_t n, int32_t *out, char *err,
                    size_t errlen) {
    return read_tokens(tf, first, n, out, 1, err, errlen);
}

/* Bit groups [g0, g0 + ng) of a version-2 file into words (2·ng: mask, doc, mask, ...). */
static int read_groups(const token_file *tf, uint64_t g0, size_t ng, uint64_t *words,
                       int after_open, char *err, size_t errlen) {
    unsigned char *raw = (unsigned char *)words;
    if (pread_full(tf->fd, raw, ng * 16, tf->flags_offset + g0 * 16) != 0) {
        read_failed(tf, "loss-mask and document-start bits", g0 * TOKENS_GROUP, after_open,
                    err, errlen);
        return -1;
    }
    for (size_t i = 0; i < 2 * ng; i++) words[i] = get_u64(raw + 8 * i); /* in place, LE */
    return 0;
}

/* Words of the range's bits from in-memory flags, or version 1's. */
static void bits_of_flags(const token_file *tf, uint64_t first, size_t n, uint64_t *trained,
                          uint64_t *doc) {
    for (size_t k = 0; k < (n + 63) / 64; k++) trained[k] = doc[k] = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t t = first + i;
        const uint8_t f = tf->flags ? tf->flags[t]
                                    : (uint8_t)(TOKEN_TRAINED | (t == 0) * TOKEN_DOC_START);
        trained[i / 64] |= (uint64_t)(f & TOKEN_TRAINED) << (i % 64);
        doc[i / 64] |= (uint64_t)((f & TOKEN_DOC_START) >> 1) << (i % 64);
    }
}

int token_file_read_bits(const token_file *tf, uint64_t first, size_t n, uint64_t *trained,
                         uint64_t *doc, char *err, size_t errlen) {
    if (!range_ok(tf, first, n, err, errlen)) return -1;
    if (tf->tokens || tf->version == 1) {
        bits_of_flags(tf, first, n, trained, doc);
        return 0;
    }
    /* the groups covering the range, a piece of at most CHUNK at a time, each output word
     * made of two group words shifted by the range's offset in its first group */
    enum { CHUNK = 128 };
    uint64_t words[2 * (CHUNK + 1)];
    const unsigned shift = (unsigned)(first % TOKENS_GROUP);
    const size_t n_out = (n + 63) / 64;
    const uint64_t g_end = (first + n - 1) / TOKENS_GROUP + 1;
    for (size_t k0 = 0; k0 < n_out; k0 += CHUNK) {
        const uint64_t g0 = first / TOKENS_GROUP + k0;
        const size_t k_n = n_out - k0 < CHUNK ? n_out - k0 : CHUNK;
        const size_t ng = g_end - g0 < k_n + 1 ? (size_t)(g_end - g0) : k_n + 1;
        if (read_groups(tf, g0, ng, words, 1, err, errlen) != 0) return -1;
        for (size_t k = 0; k < k_n; k++) {
            for (int which = 0; which < 2; which++) {
                const uint64_t lo = words[2 * k + which] >> shift;
                const uint64_t hi =
                    shift && k + 1 < ng ? words[2 * (k + 1) + which] << (64 - shift) : 0;
                (which ? doc : trained)[k0 + k] = lo | hi;
            }
        }
    }
    const unsigned tail = (unsigned)(n % 64);
    if (tail) trained[n_out - 1] &= ~(~0ull << tail), doc[n_out - 1] &= ~(~0ull << tail);
    return 0;
}

int token_file_read_flags(const token_file *tf, uint64_t first, size_t n, uint8_t *out,
                          char *err, size_t errlen) {
    if (!range_ok(tf, first, n, err, errlen)) return -1;
    enum { WORDS = 64 }; /* 4096 tokens a piece */
    uint64_t trained[WORDS], doc[WORDS];
    for (size_t done = 0; done < n;) {
        const size_t k = n - done < 64 * WORDS ? n - done : 64 * WORDS;
        if (token_file_read_bits(tf, first + done, k, trained, doc, err, errlen) != 0) return -1;
        for (size_t i = 0; i < k; i++)
            out[done + i] = (uint8_t)((trained[i / 64] >> (i % 64) & 1) * TOKEN_TRAINED |
                                      (doc[i / 64] >> (i % 64) & 1) * TOKEN_DOC_START);
        done += k;
    }
    return 0;
}

static int64_t mtime_ns(const struct stat *sb) {
    return (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
}

int token_file_check(const token_file *tf, char *err, size_t errlen) {
    if (tf->tokens) return 0;
    /* one stat of the name covers every case: the open file's own size and time are the
     * name's as long as the name leads to it, and a name leading elsewhere is a change */
    struct stat named;
    if (stat(tf->path, &named) != 0) {
        set_err(err, errlen, "%s: the token file was removed or renamed during the run (%s)",
                tf->path, strerror(errno));
        return -1;
    }
    if ((uint64_t)named.st_dev != tf->dev || (uint64_t)named.st_ino != tf->ino) {
        set_err(err, errlen, "%s: the token file was replaced during the run (the name now "
                "leads to another file)", tf->path);
        return -1;
    }
    if ((uint64_t)named.st_size != tf->size) {
        set_err(err, errlen, "%s: the token file changed size during the run (%llu bytes at "
                "start, %llu now: truncated or rewritten)", tf->path,
                (unsigned long long)tf->size, (unsigned long long)named.st_size);
        return -1;
    }
    if (mtime_ns(&named) != tf->mtime_ns) {
        set_err(err, errlen, "%s: the token file was modified during the run", tf->path);
        return -1;
    }
    return 0;
}

const char *token_file_format_name(uint32_t format) {
    static const char *const names[TOKEN_FORMAT_N] = {"other", "text", "jsonl-text",
                                                      "prompt-response", "chat"};
    return format < TOKEN_FORMAT_N ? names[format] : NULL;
}

const char *token_file_template_name(uint32_t tmpl) {
    static const char *const names[TOKEN_TEMPLATE_N] = {"none", "chatml", "llama2",
                                                         "llama3"};
    return tmpl < TOKEN_TEMPLATE_N ? names[tmpl] : NULL;
}

/* What a pass over the bits finds, to compare with the header. */
typedef struct bit_counts {
    uint64_t documents, trained, longest, last_start;
} bit_counts;

/* Adds group g (its two words) to c; bits past token n-1 must be 0, and token 0 must
 * start a document. Returns 0, or -1 with err. */
static int count_group(const token_file *tf, uint64_t g, uint64_t mask, uint64_t doc,
                       bit_counts *c, char *err, size_t errlen) {
    const uint64_t n = tf->count, base = g * TOKENS_GROUP;
    const unsigned live = n - base >= TOKENS_GROUP ? TOKENS_GROUP : (unsigned)(n - base);
    const uint64_t past = live == TOKENS_GROUP ? 0 : ~0ull << live;
    if ((mask | doc) & past) {
        set_err(err, errlen, "%s: bits set past the last token (%llu) in its last bit group "
                "(damaged file)", tf->path, (unsigned long long)n);
        return -1;
    }
    if (g == 0 && !(doc & 1)) {
        set_err(err, errlen, "%s: token 0 does not start a document (its document-start bit "
                "is 0: damaged file)", tf->path);
        return -1;
    }
    c->trained += (uint64_t)__builtin_popcountll(mask);
    c->documents += (uint64_t)__builtin_popcountll(doc);
    for (uint64_t d = doc; d; d &= d - 1) {
        const uint64_t at = base + (uint64_t)__builtin_ctzll(d);
        if (at > 0 && at - c->last_start > c->longest) c->longest = at - c->last_start;
        c->last_start = at;
    }
    return 0;
}

/* The version-2 pass over the padding after the ids and every bit group, checked against
 * the header's counts. */
static int check_bits(token_file *tf, char *err, size_t errlen) {
    const uint64_t n = tf->count, pad_at = tf->ids_offset + n * (uint64_t)tf->width;
    unsigned char pad[8] = {0};
    const size_t pad_n = (size_t)(tf->flags_offset - pad_at);
    if (pad_n && pread_full(tf->fd, pad, pad_n, pad_at) != 0) {
        read_failed(tf, "padding", n, 0, err, errlen);
        return -1;
    }
    for (size_t i = 0; i < pad_n; i++)
        if (pad[i]) {
            set_err(err, errlen, "%s: non-zero padding between the ids and the bits (damaged "
                    "file)", tf->path);
            return -1;
        }
    enum { CHUNK = 1 << 16 };
    uint64_t *words = malloc(2 * (size_t)CHUNK * sizeof *words);
    if (!words) {
        set_err(err, errlen, "%s: out of memory", tf->path);
        return -1;
    }
    bit_counts c = {0};
    const uint64_t ng = groups_of(n);
    int rc = 0;
    for (uint64_t g0 = 0; rc == 0 && g0 < ng; g0 += CHUNK) {
        const size_t k = ng - g0 < CHUNK ? (size_t)(ng - g0) : CHUNK;
        rc = read_groups(tf, g0, k, words, 0, err, errlen);
        for (size_t i = 0; rc == 0 && i < k; i++)
            rc = count_group(tf, g0 + i, words[2 * i], words[2 * i + 1], &c, err, errlen);
    }
    free(words);
    if (rc != 0) return -1;
    if (n > 0 && n - c.last_start > c.longest) c.longest = n - c.last_start;
    const struct {
        const char *what;
        uint64_t header, bits;
    } agree[] = {{"documents", tf->documents, c.documents},
                 {"trained tokens", tf->trained, c.trained},
                 {"longest document", tf->longest, c.longest}};
    for (size_t i = 0; i < sizeof agree / sizeof agree[0]; i++)
        if (agree[i].header != agree[i].bits) {
            set_err(err, errlen, "%s: the header says %llu %s, the bits say %llu (damaged "
                    "file)", tf->path, (unsigned long long)agree[i].header, agree[i].what,
                    (unsigned long long)agree[i].bits);
            return -1;
        }
    return 0;
}

/* The version-2 fields of the header: counts, provenance, reserved bytes. */
static int read_header_v2(token_file *tf, const unsigned char *hdr, char *err, size_t errlen) {
    tf->documents = get_u64(hdr + 32);
    tf->trained = get_u64(hdr + 40);
    tf->longest = get_u64(hdr + 48);
    tf->meta.truncated = get_u64(hdr + 56);
    tf->meta.dropped = get_u64(hdr + 64);
    tf->meta.max_doc_len = get_u64(hdr + 72);
    tf->meta.format = get_u32(hdr + 80);
    tf->meta.chat_template = get_u32(hdr + 84);
    if (get_u32(hdr + 28) != 0 || get_u64(hdr + 88) != 0) {
        set_err(err, errlen, "%s: reserved header bytes are not zero (a newer or damaged file)",
                tf->path);
        return -1;
    }
    if (!token_file_format_name(tf->meta.format) ||
        !token_file_template_name(tf->meta.chat_template)) {
        set_err(err, errlen, "%s: unknown source format %u or chat template %u in the header",
                tf->path, tf->meta.format, tf->meta.chat_template);
        return -1;
    }
    if (tf->meta.truncated > tf->documents ||
        (tf->meta.max_doc_len && tf->longest > tf->meta.max_doc_len)) {
        set_err(err, errlen, "%s: the header's truncated count %llu or max_doc_len %llu does not "
                "fit its %llu documents of at most %llu tokens (damaged file)", tf->path,
                (unsigned long long)tf->meta.truncated,
                (unsigned long long)tf->meta.max_doc_len, (unsigned long long)tf->documents,
                (unsigned long long)tf->longest);
        return -1;
    }
    return 0;
}

/* tf->fingerprint (tokens.h): the first and the last block of the open file, hashed. */
static int fingerprint(token_file *tf, char *err, size_t errlen) {
    const uint64_t block = TOKENS_FINGERPRINT_BLOCK, size = tf->size;
    const uint64_t first = size < block ? size : block;
    const uint64_t last_at = size > 2 * block ? size - block : first; /* no byte twice */
    char *buf = malloc(block);
    if (!buf) {
        set_err(err, errlen, "%s: out of memory", tf->path);
        return -1;
    }
    uint64_t h = shlm_fnv1a64(SHLM_FNV1A64_BASIS, &size, sizeof size);
    const uint64_t at[2] = {0, last_at}, len[2] = {first, size - last_at};
    for (int k = 0; k < 2; k++) {
        for (uint64_t done = 0; done < len[k];) {
            ssize_t r = pread(tf->fd, buf, (size_t)(len[k] - done), (off_t)(at[k] + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                set_err(err, errlen, "%s: read failed: %s", tf->path, r ? strerror(errno) :
                        "the file is shorter than at open");
                free(buf);
                return -1;
            }
            h = shlm_fnv1a64(h, buf, (size_t)r);
            done += (uint64_t)r;
        }
    }
    free(buf);
    tf->fingerprint = h;
    return 0;
}

int token_file_open(token_file *tf, const char *path, char *err, size_t errlen) {
    memset(tf, 0, sizeof *tf);
    tf->fd = -1;
    if (strlen(path) >= sizeof tf->path) {
        set_err(err, errlen, "%.200s...: path longer than %zu characters", path,
                sizeof tf->path - 1);
        return -1;
    }
    strcpy(tf->path, path);
    int32_t *chunk = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        memset(tf, 0, sizeof *tf);
        tf->fd = -1;
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        set_err(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(sb.st_mode)) {
        set_err(err, errlen, "%s: cannot read: %s", path, strerror(EISDIR));
        goto fail;
    }
    unsigned char hdr[TOKENS_HEADER_BYTES];
    size_t got = 0;
    while (got < sizeof hdr) {
        ssize_t r = pread(fd, hdr + got, sizeof hdr - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            set_err(err, errlen, "%s: cannot read: %s", path, strerror(errno));
            goto fail;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    if (got == 0) {
        set_err(err, errlen, "%s: empty file (not a shardlm token file)", path);
        goto fail;
    }
    /* the magic is checked before the length, so a short text file reads as "not a
     * token file" rather than as a damaged one */
    size_t magic_cmp = got < sizeof TOKENS_MAGIC ? got : sizeof TOKENS_MAGIC;
    if (memcmp(hdr, TOKENS_MAGIC, magic_cmp) != 0) {
        set_err(err, errlen, "%s: bad magic (not a shardlm token file)", path);
        goto fail;
    }
    const uint32_t version = got >= 12 ? get_u32(hdr + 8) : 0;
    const size_t header_bytes = version == 1 ? TOKENS_HEADER_V1_BYTES : TOKENS_HEADER_BYTES;
    if (got < 12 || ((version == 1 || version == 2) && got < header_bytes)) {
        set_err(err, errlen, "%s: truncated header: %zu of %zu bytes", path, got,
                got < 12 ? (size_t)TOKENS_HEADER_V1_BYTES : header_bytes);
        goto fail;
    }
    if (version != 1 && version != 2) {
        set_err(err, errlen, "%s: unsupported version %u (this build reads versions 1 and %d)",
                path, version, (int)TOKENS_VERSION);
        goto fail;
    }
    uint32_t width = get_u32(hdr + 12);
    uint64_t count = get_u64(hdr + 16);
    uint32_t vocab = get_u32(hdr + 24);
    if (width != 2 && width != 4) {
        set_err(err, errlen, "%s: unsupported token width %u bytes (must be 2 or 4)", path,
                width);
        goto fail;
    }
    /* ids are held as int32 in memory, so a vocabulary past INT32_MAX cannot be used */
    if (vocab == 0 || vocab > (uint32_t)INT32_MAX) {
        set_err(err, errlen, "%s: bad vocab size %u (must be 1..%d)", path, vocab, INT32_MAX);
        goto fail;
    }
    if (width == 2 && vocab > 65536) {
        set_err(err, errlen, "%s: vocab size %u does not fit 2-byte tokens", path, vocab);
        goto fail;
    }
    tf->version = (int)version;
    tf->width = (int)width;
    tf->count = count;
    tf->vocab_size = vocab;
    tf->ids_offset = header_bytes;
    if (version == 2 && read_header_v2(tf, hdr, err, errlen) != 0) goto fail;

    /* The body must hold exactly `count` tokens (and their bits): compare against the
     * file's length before allocating anything, so a garbage count cannot ask for
     * terabytes. */
    const uint64_t body = (uint64_t)sb.st_size - header_bytes;
    if (version == 1) {
        uint64_t held = body / width, stray = body % width;
        if (held != count || stray != 0) {
            const char *what = held < count ? "truncated" : "trailing data";
            if (stray)
                set_err(err, errlen,
                        "%s: %s: header says %llu tokens, body holds %llu and %llu stray bytes",
                        path, what, (unsigned long long)count, (unsigned long long)held,
                        (unsigned long long)stray);
            else
                set_err(err, errlen, "%s: %s: header says %llu tokens, body holds %llu", path,
                        what, (unsigned long long)count, (unsigned long long)held);
            goto fail;
        }
        tf->documents = count > 0;
        tf->trained = tf->longest = count;
    } else {
        /* every token takes at least 2 bytes, so a count past the body is simply wrong,
         * and below it the sizes cannot overflow */
        const uint64_t want = count <= body / 2
                                  ? ids_bytes_v2(count, (int)width) + 16 * groups_of(count)
                                  : UINT64_MAX;
        if (want == UINT64_MAX) {
            set_err(err, errlen, "%s: truncated: header says %llu tokens, more than the %llu "
                    "bytes after the header can hold", path, (unsigned long long)count,
                    (unsigned long long)body);
            goto fail;
        }
        if (want != body) {
            set_err(err, errlen, "%s: %s: header says %llu tokens, which with their bits take "
                    "%llu bytes after the header; the file has %llu", path,
                    want > body ? "truncated" : "trailing data", (unsigned long long)count,
                    (unsigned long long)want, (unsigned long long)body);
            goto fail;
        }
        tf->flags_offset = header_bytes + ids_bytes_v2(count, (int)width);
    }
    tf->fd = fd;
    tf->dev = (uint64_t)sb.st_dev;
    tf->ino = (uint64_t)sb.st_ino;
    tf->size = (uint64_t)sb.st_size;
    tf->mtime_ns = mtime_ns(&sb);
    /* every id checked in one sequential pass, a chunk at a time, never the whole body in
     * memory; then the bits */
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    chunk = malloc((size_t)TOKENS_CHUNK * sizeof *chunk);
    if (!chunk) {
        set_err(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    for (uint64_t first = 0; first < count; first += TOKENS_CHUNK) {
        size_t n = count - first < TOKENS_CHUNK ? (size_t)(count - first) : TOKENS_CHUNK;
        if (read_tokens(tf, first, n, chunk, 0, err, errlen) != 0) goto fail;
    }
    free(chunk);
    chunk = NULL;
    if (version == 2 && check_bits(tf, err, errlen) != 0) goto fail;
    if (fingerprint(tf, err, errlen) != 0) goto fail;
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM); /* windows are read in shuffled order */
    return 0;

fail:
    free(chunk);
    close(fd);
    memset(tf, 0, sizeof *tf);
    tf->fd = -1;
    return -1;
}

void token_file_close(token_file *tf) {
    if (tf->tokens) free(tf->tokens), free(tf->flags);
    else if (tf->fd >= 0) close(tf->fd);
    memset(tf, 0, sizeof *tf);
    tf->fd = -1;
}

/* The header's counts from the flags (NULL: one document, every token trained). Returns
 * 0, or -1 with err when a flag holds other bits or token 0 does not start a document. */
static int count_flags(const char *path, const uint8_t *flags, uint64_t n, uint64_t *documents,
                       uint64_t *trained, uint64_t *longest, char *err, size_t errlen) {
    *documents = n > 0;
    *trained = *longest = n;
    if (!flags) return 0;
    if (n > 0 && !(flags[0] & TOKEN_DOC_START)) {
        set_err(err, errlen, "%s: token 0 must start a document", path);
        return -1;
    }
    uint64_t docs = 0, tr = 0, lo = 0, start = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (flags[i] & ~(TOKEN_TRAINED | TOKEN_DOC_START)) {
            set_err(err, errlen, "%s: token %llu has flags 0x%x (only TOKEN_TRAINED and "
                    "TOKEN_DOC_START exist)", path, (unsigned long long)i, flags[i]);
            return -1;
        }
        tr += flags[i] & TOKEN_TRAINED;
        if (flags[i] & TOKEN_DOC_START) {
            docs++;
            if (i - start > lo) lo = i - start;
            start = i;
        }
    }
    if (n - start > lo) lo = n - start;
    *documents = docs;
    *trained = tr;
    *longest = lo;
    return 0;
}

int token_file_write(const char *path, const int32_t *tokens, const uint8_t *flags, uint64_t n,
                     int width, uint32_t vocab_size, const token_file_meta *meta, char *err,
                     size_t errlen) {
    const token_file_meta zero = {0};
    if (!meta) meta = &zero;
    if (width != 2 && width != 4) {
        set_err(err, errlen, "%s: unsupported token width %d bytes (must be 2 or 4)", path,
                width);
        return -1;
    }
    if (vocab_size == 0 || vocab_size > (uint32_t)INT32_MAX ||
        (width == 2 && vocab_size > 65536)) {
        set_err(err, errlen, "%s: vocab size %u does not fit %d-byte tokens", path, vocab_size,
                width);
        return -1;
    }
    /* check every id and flag before creating the file, so a bad call leaves nothing */
    for (uint64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= vocab_size) {
            set_err(err, errlen, "%s: token %d at index %llu is outside 0..%u", path, tokens[i],
                    (unsigned long long)i, vocab_size - 1);
            return -1;
        }
    }
    uint64_t documents, trained, longest;
    if (count_flags(path, flags, n, &documents, &trained, &longest, err, errlen) != 0)
        return -1;
    if (!token_file_format_name(meta->format) || !token_file_template_name(meta->chat_template) ||
        meta->truncated > documents || (meta->max_doc_len && longest > meta->max_doc_len)) {
        set_err(err, errlen, "%s: inconsistent metadata (format %u, template %u, %llu truncated "
                "of %llu documents, longest %llu, max_doc_len %llu)", path, meta->format,
                meta->chat_template, (unsigned long long)meta->truncated,
                (unsigned long long)documents, (unsigned long long)longest,
                (unsigned long long)meta->max_doc_len);
        return -1;
    }

    safe_file out;
    if (safe_file_begin(&out, path, err, errlen) != 0) return -1;
    FILE *f = out.fp;
    unsigned char hdr[TOKENS_HEADER_BYTES] = {0};
    memcpy(hdr, TOKENS_MAGIC, sizeof TOKENS_MAGIC);
    put_u32(hdr + 8, TOKENS_VERSION);
    put_u32(hdr + 12, (uint32_t)width);
    put_u64(hdr + 16, n);
    put_u32(hdr + 24, vocab_size);
    put_u64(hdr + 32, documents);
    put_u64(hdr + 40, trained);
    put_u64(hdr + 48, longest);
    put_u64(hdr + 56, meta->truncated);
    put_u64(hdr + 64, meta->dropped);
    put_u64(hdr + 72, meta->max_doc_len);
    put_u32(hdr + 80, meta->format);
    put_u32(hdr + 84, meta->chat_template);
    int ok = fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr;

    unsigned char *buf = ok ? malloc((size_t)TOKENS_CHUNK * width) : NULL;
    if (ok && !buf) {
        safe_file_abort(&out);
        set_err(err, errlen, "%s: out of memory", path);
        return -1;
    }
    for (uint64_t done = 0; ok && done < n;) {
        size_t c = n - done < TOKENS_CHUNK ? (size_t)(n - done) : TOKENS_CHUNK;
        for (size_t i = 0; i < c; i++) {
            uint32_t id = (uint32_t)tokens[done + i];
            unsigned char *p = buf + i * width;
            if (width == 2) {
                p[0] = (unsigned char)id;
                p[1] = (unsigned char)(id >> 8);
            } else {
                put_u32(p, id);
            }
        }
        ok = fwrite(buf, width, c, f) == c;
        done += c;
    }
    const unsigned char zeros[8] = {0};
    const size_t pad = (size_t)(ids_bytes_v2(n, width) - n * (uint64_t)width);
    if (ok && pad) ok = fwrite(zeros, 1, pad, f) == pad;
    /* the bit groups, TOKENS_CHUNK / 64 groups (16 bytes each) through the same buffer */
    const uint64_t ng = groups_of(n), per = (uint64_t)TOKENS_CHUNK * width / 16;
    for (uint64_t g0 = 0; ok && g0 < ng; g0 += per) {
        const size_t k = ng - g0 < per ? (size_t)(ng - g0) : (size_t)per;
        for (size_t g = 0; g < k; g++) {
            uint64_t mask = 0, doc = 0;
            const uint64_t base = (g0 + g) * TOKENS_GROUP;
            for (unsigned b = 0; b < TOKENS_GROUP && base + b < n; b++) {
                const uint8_t fl =
                    flags ? flags[base + b]
                          : (uint8_t)(TOKEN_TRAINED | (base + b == 0) * TOKEN_DOC_START);
                mask |= (uint64_t)(fl & TOKEN_TRAINED) << b;
                doc |= (uint64_t)((fl & TOKEN_DOC_START) >> 1) << b;
            }
            put_u64(buf + 16 * g, mask);
            put_u64(buf + 16 * g + 8, doc);
        }
        ok = fwrite(buf, 16, k, f) == k;
    }
    free(buf);
    if (!ok) {
        set_err(err, errlen, "%s: writing %s failed: %s", path, out.tmp, strerror(errno));
        safe_file_abort(&out);
        return -1;
    }
    if (safe_file_finish(&out, err, errlen) != 0) return -1;
    return 0;
}
