/* TensorBoard event files: Event protocol buffers (a file version, scalar summaries, a
 * text summary, a restart marker) in TFRecord framing, written to a new file
 * events.out.tfevents.<time>.<host>.<pid> that TensorBoard reads while it grows. */
#ifndef SHLM_TFEVENTS_H
#define SHLM_TFEVENTS_H

/*
 * The format, as TensorBoard's reader takes it (tensorboard/compat/proto/event.proto,
 * summary.proto, tensor.proto; its record reader in compat/tensorflow_stub):
 *   - a record is uint64 length (little-endian), uint32 masked CRC32C of those 8 bytes,
 *     the data, uint32 masked CRC32C of the data; masked(c) = ((c >> 15) | (c << 17))
 *     + 0xa282ead8 (CRC32C: the Castagnoli polynomial, reflected 0x82f63b78);
 *   - the data of each record is one Event: wall_time (1, double, seconds since the
 *     epoch), step (2, int64), and one of file_version (3, "brain.Event:2" in the
 *     file's first record), summary (5) or session_log (7);
 *   - a Summary holds Values: tag (1) and simple_value (2, float) for a scalar; for
 *     text, tag, a string tensor (8: dtype 7 = DT_STRING, an empty shape = a scalar,
 *     string_val) and metadata (9) whose plugin_data names the plugin "text";
 *   - SessionLog status START (1) at step S is TensorBoard's restart marker: its reader
 *     drops what earlier files hold at steps S and later.
 * The encoder writes fields in field-number order and leaves out proto3 defaults (a zero
 * wall_time or step), as protobuf's own serializer does, so an event's bytes are the
 * ones tensorboard's classes would write (tests/test_tensorboard checks them against bytes
 * made by them). Five message types of a few fields each are encoded by hand here: a
 * protobuf library would bring a code generator and a dependency for them.
 *
 * Local functions (no MPI). Each returns 0, or -1 with one line in err naming the file
 * and the reason.
 */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/safe_file.h"

/* The file's first event, which names the format version of the events after it. */
#define TFEVENTS_FILE_VERSION "brain.Event:2"

/* CRC32C of n bytes (the standard CRC: initial and final complement; "123456789" gives
 * 0xe3069283), and its masked form as records carry it. */
uint32_t tfevents_crc32c(const void *data, size_t n);
uint32_t tfevents_masked_crc32c(const void *data, size_t n);

/* A growing byte buffer that events are encoded into. */
typedef struct tfevents_buf {
    uint8_t *p;
    size_t n, cap;
    int failed;       /* an allocation failed: the contents are not to be used */
} tfevents_buf;
void tfevents_buf_free(tfevents_buf *b);

/* One scalar of a summary. */
typedef struct tfevents_scalar {
    const char *tag;  /* "train/loss": TensorBoard groups tags by the part before '/' */
    double value;     /* written as a float (simple_value is one) */
} tfevents_scalar;

/* Encoders: each appends one Event's bytes to b (no framing). */
void tfevents_encode_file_version(tfevents_buf *b, double wall_time);
void tfevents_encode_scalars(tfevents_buf *b, double wall_time, int64_t step,
                             const tfevents_scalar *v, int n);
/* text: TensorBoard's text plugin renders it as Markdown. */
void tfevents_encode_text(tfevents_buf *b, double wall_time, int64_t step, const char *tag,
                          const char *text);
void tfevents_encode_session_start(tfevents_buf *b, double wall_time, int64_t step);

/* Appends the record framing data[0..n) to b. */
void tfevents_frame(tfevents_buf *b, const void *data, size_t n);

/* An event file being written. */
typedef struct tfevents_file {
    FILE *fp;
    char path[SAFE_FILE_PATH_MAX];
    tfevents_buf event, record; /* reused for every event */
} tfevents_file;

/* Creates dir (mkdir -p; a path there that is not a directory is an error) and a new
 * event file in it, events.out.tfevents.<T>.<host>.<pid>, and writes its file-version
 * event at wall_time. T is wall_time's second, or one more than the latest T of an event
 * file already in dir when that is as late: TensorBoard reads a directory's files in the
 * order of their names, so a run resumed into the directory comes after the runs before
 * it whatever the clocks say. The file is opened as io/safe_file.h appends (no link, no
 * other hard link, nothing but a regular file) and must not exist before. */
int tfevents_create(tfevents_file *f, const char *dir, const char *host, double wall_time,
                    char *err, size_t errlen);
/* Write one event each, framed, and flush it to the file (a record is whole in the file
 * once the call returns). */
int tfevents_write_scalars(tfevents_file *f, double wall_time, int64_t step,
                           const tfevents_scalar *v, int n, char *err, size_t errlen);
int tfevents_write_text(tfevents_file *f, double wall_time, int64_t step, const char *tag,
                        const char *text, char *err, size_t errlen);
int tfevents_write_session_start(tfevents_file *f, double wall_time, int64_t step, char *err,
                                 size_t errlen);
/* Closes the file (safe on one never created or already closed). */
void tfevents_close(tfevents_file *f);

#endif
