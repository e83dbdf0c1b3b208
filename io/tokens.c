/* Token data files (see tokens.h for the layout): open with full validation, and write
 * through a temporary name so a crash never leaves a half-written file under OUT. */
#include "io/tokens.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/safe_file.h"

/* Tokens per fread/fwrite: large enough to stream at disk speed, small enough that the
 * staging buffer is a rounding error next to the tokens themselves. */
enum { TOKENS_CHUNK = 1 << 20 };

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

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

int token_file_open(token_file *tf, const char *path, char *err, size_t errlen) {
    memset(tf, 0, sizeof *tf);
    if (strlen(path) >= sizeof tf->path) {
        set_err(err, errlen, "%.200s...: path longer than %zu characters", path,
                sizeof tf->path - 1);
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    unsigned char hdr[TOKENS_HEADER_BYTES];
    size_t got = fread(hdr, 1, sizeof hdr, f);
    if (got < sizeof hdr && ferror(f)) { /* e.g. a directory */
        set_err(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        goto fail;
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
    if (fseeko(f, 0, SEEK_END) != 0) {
        set_err(err, errlen, "%s: cannot seek: %s", path, strerror(errno));
        goto fail;
    }
    off_t size = ftello(f);
    if (size < 0 || fseeko(f, TOKENS_HEADER_BYTES, SEEK_SET) != 0) {
        set_err(err, errlen, "%s: cannot seek: %s", path, strerror(errno));
        goto fail;
    }
    uint64_t body = (uint64_t)size - TOKENS_HEADER_BYTES;
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
    /* map the file: the ids are checked in one sequential pass and then read where the
     * loader needs them, never copied whole into memory */
    size_t map_len = (size_t)size;
    void *map = mmap(NULL, map_len, PROT_READ, MAP_SHARED, fileno(f), 0);
    if (map == MAP_FAILED) {
        set_err(err, errlen, "%s: cannot map %llu bytes: %s", path, (unsigned long long)size,
                strerror(errno));
        goto fail;
    }
    fclose(f);
    f = NULL;
    madvise(map, map_len, MADV_SEQUENTIAL);
    tf->map = map;
    tf->map_len = map_len;
    tf->body = (const unsigned char *)map + TOKENS_HEADER_BYTES;
    tf->width = (int)width;
    tf->count = count;
    tf->vocab_size = vocab;
    for (uint64_t i = 0; i < count; i++) {
        uint32_t id = (uint32_t)token_at(tf, i);
        if (id >= vocab) {
            set_err(err, errlen, "%s: token %u at index %llu is >= vocab_size %u", path, id,
                    (unsigned long long)i, vocab);
            goto fail;
        }
    }
    madvise(map, map_len, MADV_RANDOM); /* windows are read in shuffled order */
    strcpy(tf->path, path);
    return 0;

fail:
    if (f) fclose(f);
    if (tf->map) munmap(tf->map, tf->map_len);
    free(tf->tokens);
    memset(tf, 0, sizeof *tf);
    return -1;
}

void token_file_close(token_file *tf) {
    if (tf->map) munmap(tf->map, tf->map_len);
    free(tf->tokens);
    memset(tf, 0, sizeof *tf);
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
