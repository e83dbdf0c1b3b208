/* safetensors files: a validating reader (tensor list, metadata, raw or fp32-converted
 * reads of whole tensors or element ranges) and a writer (whole or streamed). */
#ifndef SHLM_SAFETENSORS_H
#define SHLM_SAFETENSORS_H

/*
 * Format: 8-byte little-endian header length N, then N bytes of JSON (an object
 * mapping tensor name -> {"dtype", "shape", "data_offsets": [begin, end]}, plus an
 * optional "__metadata__" object of string -> string), then the data. Offsets are
 * bytes relative to the start of the data; tensors are row-major, little-endian.
 *
 * Every function that can fail returns 0 on success and -1 on failure, with one line
 * naming the file (and the tensor, where there is one) written into err. Nothing
 * here exits, aborts or prints. This code assumes a little-endian host (x86-64,
 * aarch64), as the format's data are little-endian and are copied as they are.
 */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/safe_file.h"

typedef enum safetensors_dtype {
    SAFETENSORS_BOOL = 0,
    SAFETENSORS_U8,
    SAFETENSORS_I8,
    SAFETENSORS_I16,
    SAFETENSORS_U16,
    SAFETENSORS_F16,
    SAFETENSORS_BF16,
    SAFETENSORS_I32,
    SAFETENSORS_U32,
    SAFETENSORS_F32,
    SAFETENSORS_I64,
    SAFETENSORS_U64,
    SAFETENSORS_F64,
    SAFETENSORS_N_DTYPES
} safetensors_dtype;

/* The format's name of a dtype ("F32", "BF16", ...). */
const char *safetensors_dtype_name(safetensors_dtype t);
/* Bytes per element. */
size_t safetensors_dtype_size(safetensors_dtype t);
/* Parses a dtype name; returns 0, or -1 if it is not one of the above. */
int safetensors_dtype_parse(const char *name, safetensors_dtype *out);

enum { SAFETENSORS_MAX_DIMS = 8 };

typedef struct safetensors_tensor {
    char *name;
    safetensors_dtype dtype;
    int ndim;                              /* 0 for a scalar */
    int64_t shape[SAFETENSORS_MAX_DIMS];
    uint64_t numel;                        /* product of shape (1 for a scalar) */
    uint64_t begin, end;                   /* byte offsets relative to the data start */
} safetensors_tensor;

typedef struct safetensors_file {
    char path[1024];
    FILE *fp;
    uint64_t file_size;
    uint64_t header_len;   /* N, the JSON's length in bytes */
    uint64_t data_start;   /* 8 + N: file offset of data byte 0 */
    int n_tensors;
    safetensors_tensor *tensors; /* in the order of their data (by begin) */
    int n_meta;
    char **meta_keys;      /* __metadata__, in header order */
    char **meta_values;
} safetensors_file;

/* Opens a file and validates all of it except the data bytes' values: header length
 * against the file size, the JSON, every entry's dtype, shape and data_offsets
 * (begin <= end, end - begin == numel·element size, inside the data), no two tensors
 * overlapping, no holes (the data is exactly the tensors, as the format requires), no
 * duplicate names, string-valued metadata. On failure *f holds nothing to close. */
int safetensors_open(safetensors_file *f, const char *path, char *err, size_t errlen);
void safetensors_close(safetensors_file *f);

/* The tensor called name, or NULL. */
const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name);
/* The __metadata__ value of key, or NULL if the file has no such key. */
const char *safetensors_metadata(const safetensors_file *f, const char *key);

/* Copies the tensor's bytes as stored (buf must hold t->end - t->begin bytes). */
int safetensors_read_raw(safetensors_file *f, const safetensors_tensor *t, void *buf,
                         size_t buf_bytes, char *err, size_t errlen);
/* Reads elements [first, first + count) of the flattened tensor, converted to fp32,
 * into out (count floats). Works for F32, BF16, F16 and F64 (rounded); other dtypes
 * are an error. The range must lie inside the tensor. */
int safetensors_read_f32(safetensors_file *f, const safetensors_tensor *t, uint64_t first,
                         uint64_t count, float *out, char *err, size_t errlen);

/* fp16 / bf16 <-> fp32 conversions (bit patterns in uint16_t). To bf16/f16 rounds to
 * nearest even; NaN stays NaN. */
float safetensors_bf16_to_f32(uint16_t h);
float safetensors_f16_to_f32(uint16_t h);
uint16_t safetensors_f32_to_bf16(float x);
uint16_t safetensors_f32_to_f16(float x);

/* ---- writing ----
 * Whole-file writer: n tensors, tensor i named names[i], of dtypes[i], with ndims[i]
 * dimensions shapes[i][0..ndims[i]), its bytes at data[i] (row-major, as stored);
 * n_meta string pairs of __metadata__ (meta_keys may be NULL when n_meta is 0).
 * The data are laid out in the order given. The file is written under a temporary
 * name and renamed into place, so a failure never leaves a partial file at path (and a
 * symbolic link, a FIFO, a device or anything else but a regular file at path is
 * refused, io/safe_file.h). */
int safetensors_write(const char *path, int n, const char *const *names,
                      const safetensors_dtype *dtypes, const int *ndims,
                      const int64_t *const *shapes, const void *const *data, int n_meta,
                      const char *const *meta_keys, const char *const *meta_values,
                      char *err, size_t errlen);
/* The same for an output a user may send to a stream: an existing FIFO or character
 * device at path (a pipe, /dev/stdout, /dev/null) is written as it is, in one pass
 * (safe_file_begin_output); any other path as safetensors_write. */
int safetensors_write_output(const char *path, int n, const char *const *names,
                             const safetensors_dtype *dtypes, const int *ndims,
                             const int64_t *const *shapes, const void *const *data, int n_meta,
                             const char *const *meta_keys, const char *const *meta_values,
                             char *err, size_t errlen);

/* Streaming writer, for tensors too large to hold at once (a 70B export): begin()
 * writes the header, append() writes the next bytes of data (the tensors in the
 * order given, each one's bytes in order, in as many pieces as suits), finish()
 * checks that exactly every tensor's bytes were written and renames the file into
 * place. abort() (also after a failed append/finish) removes the temporary file. */
typedef struct safetensors_writer {
    char path[1024];
    safe_file out; /* under a temporary name until finish() (io/safe_file.h) */
    uint64_t total_bytes;   /* data bytes the header promises */
    uint64_t written_bytes; /* data bytes appended so far */
} safetensors_writer;

int safetensors_writer_begin(safetensors_writer *w, const char *path, int n,
                             const char *const *names, const safetensors_dtype *dtypes,
                             const int *ndims, const int64_t *const *shapes, int n_meta,
                             const char *const *meta_keys, const char *const *meta_values,
                             char *err, size_t errlen);
int safetensors_writer_append(safetensors_writer *w, const void *bytes, size_t nbytes,
                              char *err, size_t errlen);
int safetensors_writer_finish(safetensors_writer *w, char *err, size_t errlen);
void safetensors_writer_abort(safetensors_writer *w);

#endif
