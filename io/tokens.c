/* Token data files (see tokens.h for the layout): open with full validation, windows read
 * with pread and checked against the file as opened, and writes through a temporary name
 * so a crash never leaves a half-written file under OUT. */
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

/* Tokens [first, first + n) into out; `after_open` says whether a failure means the file
 * changed under us (a run) or is simply bad (the validation pass of open). */
static int read_tokens(const token_file *tf, uint64_t first, size_t n, int32_t *out,
                       int after_open, char *err, size_t errlen) {
    const char *changed = after_open ? " (the file changed after it was opened)" : "";
    if (first > tf->count || n > tf->count - first) {
        set_err(err, errlen, "%s: tokens %llu..%llu asked for, the file holds %llu", tf->path,
                (unsigned long long)first, (unsigned long long)(first + n),
                (unsigned long long)tf->count);
        return -1;
    }
    if (tf->tokens) {
        memcpy(out, tf->tokens + first, n * sizeof *out);
        return 0;
    }
    const size_t w = (size_t)tf->width;
    unsigned char *raw = (unsigned char *)out; /* the bytes land in out, decoded in place */
    if (pread_full(tf->fd, raw, n * w, TOKENS_HEADER_BYTES + first * w) != 0) {
        if (errno == 0)
            set_err(err, errlen, "%s: end of file at token %llu of %llu: the file was "
                    "truncated%s", tf->path, (unsigned long long)first,
                    (unsigned long long)tf->count, after_open ? " after it was opened" : "");
        else
            set_err(err, errlen, "%s: cannot read tokens %llu..%llu: %s%s", tf->path,
                    (unsigned long long)first, (unsigned long long)(first + n),
                    strerror(errno), changed);
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

int token_file_open(token_file *tf, const char *path, char *err, size_t errlen) {
    memset(tf, 0, sizeof *tf);
    tf->fd = -1;
    if (strlen(path) >= sizeof tf->path) {
        set_err(err, errlen, "%.200s...: path longer than %zu characters", path,
                sizeof tf->path - 1);
        return -1;
    }
    int32_t *chunk = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
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
    if (got < sizeof hdr) {
        set_err(err, errlen, "%s: truncated header: %zu of %d bytes", path, got,
                (int)TOKENS_HEADER_BYTES);
        goto fail;
    }
    uint32_t version = get_u32(hdr + 8);
    uint32_t width = get_u32(hdr + 12);
    uint64_t count = get_u64(hdr + 16);
    uint32_t vocab = get_u32(hdr + 24);
    if (version != TOKENS_VERSION) {
        set_err(err, errlen, "%s: unsupported version %u (this build reads version %d)", path,
                version, (int)TOKENS_VERSION);
        goto fail;
    }
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

    /* The body must hold exactly `count` tokens: compare against the file's length
     * before allocating anything, so a garbage count cannot ask for terabytes. */
    uint64_t body = (uint64_t)sb.st_size - TOKENS_HEADER_BYTES;
    uint64_t held = body / width, stray = body % width;
    if (held != count || stray != 0) {
        const char *what = held < count ? "truncated" : "trailing data";
        if (stray)
            set_err(err, errlen,
                    "%s: %s: header says %llu tokens, body holds %llu and %llu stray bytes",
                    path, what, (unsigned long long)count, (unsigned long long)held,
                    (unsigned long long)stray);
        else
            set_err(err, errlen, "%s: %s: header says %llu tokens, body holds %llu", path, what,
                    (unsigned long long)count, (unsigned long long)held);
        goto fail;
    }
    strcpy(tf->path, path);
    tf->fd = fd;
    tf->width = (int)width;
    tf->count = count;
    tf->vocab_size = vocab;
    tf->dev = (uint64_t)sb.st_dev;
    tf->ino = (uint64_t)sb.st_ino;
    tf->size = (uint64_t)sb.st_size;
    tf->mtime_ns = mtime_ns(&sb);
    /* every id checked in one sequential pass, a chunk at a time, never the whole body in
     * memory */
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
    if (tf->tokens) free(tf->tokens);
    else if (tf->fd >= 0) close(tf->fd);
    memset(tf, 0, sizeof *tf);
    tf->fd = -1;
}

int token_file_write(const char *path, const int32_t *tokens, uint64_t n, int width,
                     uint32_t vocab_size, char *err, size_t errlen) {
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
    /* check every id before creating the file, so a bad call leaves nothing behind */
    for (uint64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= vocab_size) {
            set_err(err, errlen, "%s: token %d at index %llu is outside 0..%u", path, tokens[i],
                    (unsigned long long)i, vocab_size - 1);
            return -1;
        }
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
    free(buf);
    if (!ok) {
        set_err(err, errlen, "%s: writing %s failed: %s", path, out.tmp, strerror(errno));
        safe_file_abort(&out);
        return -1;
    }
    if (safe_file_finish(&out, err, errlen) != 0) return -1;
    return 0;
}
