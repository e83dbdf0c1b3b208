/* TensorBoard event files (tfevents.h): CRC32C, the record framing, the Event encoder,
 * the file. */
#include "io/tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/errmsg.h"

/* ---- CRC32C ---- */

/* 256 entries of the reflected Castagnoli polynomial, made once (events are a few KiB per
 * logged step: a byte-wise table is plenty). */
static uint32_t crc_table[256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void crc_table_make(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t tfevents_crc32c(const void *data, size_t n) {
    pthread_once(&crc_table_once, crc_table_make);
    const uint8_t *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

uint32_t tfevents_masked_crc32c(const void *data, size_t n) {
    uint32_t c = tfevents_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- the buffer and protobuf's wire format ---- */

void tfevents_buf_free(tfevents_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Room for `more` bytes after the contents (0, or -1 with b->failed set). */
static int reserve(tfevents_buf *b, size_t more) {
    if (b->failed) return -1;
    if (b->n + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
        b->failed = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static void put_bytes(tfevents_buf *b, const void *data, size_t n) {
    if (n == 0 || reserve(b, n) != 0) return;
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_le(tfevents_buf *b, uint64_t v, int bytes) {
    uint8_t le[8];
    for (int i = 0; i < bytes; i++) le[i] = (uint8_t)(v >> (8 * i));
    put_bytes(b, le, (size_t)bytes);
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

static void put_varint(tfevents_buf *b, uint64_t v) {
    uint8_t out[10];
    size_t n = 0;
    while (v >= 0x80) out[n++] = (uint8_t)(v | 0x80), v >>= 7;
    out[n++] = (uint8_t)v;
    put_bytes(b, out, n);
}

enum { WIRE_VARINT = 0, WIRE_I64 = 1, WIRE_LEN = 2, WIRE_I32 = 5 };

static void put_key(tfevents_buf *b, unsigned field, unsigned wire) {
    put_varint(b, (uint64_t)field << 3 | wire);
}

static void put_string(tfevents_buf *b, unsigned field, const char *s) {
    size_t n = strlen(s);
    put_key(b, field, WIRE_LEN);
    put_varint(b, n);
    put_bytes(b, s, n);
}

static void put_double(tfevents_buf *b, unsigned field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_key(b, field, WIRE_I64);
    put_le(b, bits, 8);
}

static void put_float(tfevents_buf *b, unsigned field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_key(b, field, WIRE_I32);
    put_le(b, bits, 4);
}

/* A nested message: its key now, its contents next, then message_end writes the length
 * in front of them (the contents move up by the length's size). */
static size_t message_begin(tfevents_buf *b, unsigned field) {
    put_key(b, field, WIRE_LEN);
    return b->n;
}

static void message_end(tfevents_buf *b, size_t start) {
    if (b->failed) return;
    size_t len = b->n - start, k = varint_len(len);
    if (reserve(b, k) != 0) return;
    memmove(b->p + start + k, b->p + start, len);
    size_t end = b->n + k;
    b->n = start;
    put_varint(b, len);
    b->n = end;
}

/* Event fields 1 and 2, each left out at proto3's default of zero. */
static void event_head(tfevents_buf *b, double wall_time, int64_t step) {
    if (wall_time != 0) put_double(b, 1, wall_time);
    if (step != 0) {
        put_key(b, 2, WIRE_VARINT);
        put_varint(b, (uint64_t)step);
    }
}

void tfevents_encode_file_version(tfevents_buf *b, double wall_time) {
    event_head(b, wall_time, 0);
    put_string(b, 3, TFEVENTS_FILE_VERSION);
}

void tfevents_encode_scalars(tfevents_buf *b, double wall_time, int64_t step,
                             const tfevents_scalar *v, int n) {
    event_head(b, wall_time, step);
    size_t summary = message_begin(b, 5);
    for (int i = 0; i < n; i++) {
        size_t value = message_begin(b, 1);
        put_string(b, 1, v[i].tag);
        put_float(b, 2, (float)v[i].value);
        message_end(b, value);
    }
    message_end(b, summary);
}

void tfevents_encode_text(tfevents_buf *b, double wall_time, int64_t step, const char *tag,
                          const char *text) {
    event_head(b, wall_time, step);
    size_t summary = message_begin(b, 5);
    size_t value = message_begin(b, 1);
    put_string(b, 1, tag);
    size_t tensor = message_begin(b, 8);
    put_key(b, 1, WIRE_VARINT);
    put_varint(b, 7); /* DT_STRING */
    message_end(b, message_begin(b, 2)); /* tensor_shape: no dimensions, a scalar */
    put_string(b, 8, text);              /* string_val */
    message_end(b, tensor);
    size_t metadata = message_begin(b, 9);
    size_t plugin = message_begin(b, 1);
    put_string(b, 1, "text");
    message_end(b, plugin);
    message_end(b, metadata);
    message_end(b, value);
    message_end(b, summary);
}

void tfevents_encode_session_start(tfevents_buf *b, double wall_time, int64_t step) {
    event_head(b, wall_time, step);
    size_t log = message_begin(b, 7);
    put_key(b, 1, WIRE_VARINT);
    put_varint(b, 1); /* SessionLog.START */
    message_end(b, log);
}

void tfevents_frame(tfevents_buf *b, const void *data, size_t n) {
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    put_bytes(b, len, sizeof len);
    put_le(b, tfevents_masked_crc32c(len, sizeof len), 4);
    put_bytes(b, data, n);
    put_le(b, tfevents_masked_crc32c(data, n), 4);
}

/* ---- the file ---- */

static const char name_prefix[] = "events.out.tfevents.";

/* The latest <T> among dir's event file names, or -1. */
static long long latest_file_time(const char *dir) {
    long long latest = -1;
    DIR *d = opendir(dir);
    if (!d) return -1;
    const struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, name_prefix, sizeof name_prefix - 1) != 0) continue;
        char *end;
        long long t = strtoll(e->d_name + sizeof name_prefix - 1, &end, 10);
        if (end != e->d_name + sizeof name_prefix - 1 && *end == '.' && t > latest) latest = t;
    }
    closedir(d);
    return latest;
}

/* Frames the event in f->event and writes the record whole, then flushes. */
static int write_record(tfevents_file *f, char *err, size_t errlen) {
    f->record.n = 0;
    tfevents_frame(&f->record, f->event.p, f->event.n);
    if (f->event.failed || f->record.failed) {
        f->event.failed = f->record.failed = 0;
        io_set_err(err, errlen, "%s: out of memory encoding an event", f->path);
        return -1;
    }
    if (!f->fp) {
        io_set_err(err, errlen, "%s: the event file is closed", f->path);
        return -1;
    }
    if (fwrite(f->record.p, 1, f->record.n, f->fp) != f->record.n || fflush(f->fp) != 0) {
        io_set_err(err, errlen, "%s: cannot write: %s", f->path, strerror(errno));
        return -1;
    }
    return 0;
}

int tfevents_create(tfevents_file *f, const char *dir, const char *host, double wall_time,
                    char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    if (safe_file_mkdir_p(dir, err, errlen) != 0) return -1;
    long long t = (long long)wall_time, latest = latest_file_time(dir);
    if (latest >= t) t = latest + 1;
    int n = snprintf(f->path, sizeof f->path, "%s/%s%010lld.%s.%ld", dir, name_prefix, t, host,
                     (long)getpid());
    if (n < 0 || (size_t)n >= sizeof f->path) {
        io_set_err(err, errlen, "%.200s...: path too long for an event file", dir);
        return -1;
    }
    struct stat sb;
    if (lstat(f->path, &sb) == 0) {
        io_set_err(err, errlen, "%s: already exists: an event file is never written twice",
                   f->path);
        return -1;
    }
    f->fp = safe_file_append(f->path, err, errlen);
    if (!f->fp) return -1;
    tfevents_encode_file_version(&f->event, wall_time);
    if (write_record(f, err, errlen) != 0) {
        tfevents_close(f);
        return -1;
    }
    return 0;
}

int tfevents_write_scalars(tfevents_file *f, double wall_time, int64_t step,
                           const tfevents_scalar *v, int n, char *err, size_t errlen) {
    f->event.n = 0;
    tfevents_encode_scalars(&f->event, wall_time, step, v, n);
    return write_record(f, err, errlen);
}

int tfevents_write_text(tfevents_file *f, double wall_time, int64_t step, const char *tag,
                        const char *text, char *err, size_t errlen) {
    f->event.n = 0;
    tfevents_encode_text(&f->event, wall_time, step, tag, text);
    return write_record(f, err, errlen);
}

int tfevents_write_session_start(tfevents_file *f, double wall_time, int64_t step, char *err,
                                 size_t errlen) {
    f->event.n = 0;
    tfevents_encode_session_start(&f->event, wall_time, step);
    return write_record(f, err, errlen);
}

void tfevents_close(tfevents_file *f) {
    if (f->fp) fclose(f->fp);
    f->fp = NULL;
    tfevents_buf_free(&f->event);
    tfevents_buf_free(&f->record);
}
