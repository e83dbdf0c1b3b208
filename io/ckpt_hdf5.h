/* The checkpoint file format over parallel HDF5: collective create/open/close, fp32
 * datasets written and read as flat element ranges (hyperslabs), attributes, checksums. */
#ifndef SHLM_CKPT_HDF5_H
#define SHLM_CKPT_HDF5_H

/*
 * A checkpoint is one HDF5 file (docs/checkpoints.md "Checkpoints"):
 *   /model/<hf name>              fp32, HF shape    master weights
 *   /optim/exp_avg/<hf name>      fp32, HF shape    AdamW first moment
 *   /optim/exp_avg_sq/<hf name>   fp32, HF shape    AdamW second moment
 *   /hf/<file name>               uint8, 1-D        a Hugging Face file kept for export
 * with the training state as attributes of "/" and a "checksum" attribute (uint64) on
 * every dataset. This layer knows nothing of models or shards: it creates datasets,
 * moves flat element ranges of them between files and host buffers, and reads and
 * writes attributes. The glue that decides which rank moves which range is src/ckpt/
 * (checkpoint.h).
 *
 * Every function that touches the file is collective over the file's communicator
 * unless marked "local": all ranks call it in the same order with the same names (a
 * rank with nothing to move passes count 0). Each returns 0, or -1 with one line in
 * err naming the call, the object and HDF5's innermost message. Nothing here prints,
 * exits or aborts: callers agree on failure across ranks (src/ckpt/).
 *
 * Checksum ("sum64-pos", world-size independent, computed in parallel): with w_i the
 * 32-bit little-endian word of element i of the row-major flattened dataset (n
 * elements) and all arithmetic mod 2^64,
 *   s1 = sum_i w_i,   s2 = sum_i i·w_i,   checksum = mix(s1 XOR mix(s2 + n))
 * where mix is the splitmix64 finaliser (see ckpt_h5_mix). Both sums are additive over
 * disjoint ranges, so each rank sums the elements it writes or reads and one
 * MPI_Allreduce(MPI_UINT64_T, MPI_SUM) completes them, whatever the world size. A changed
 * element changes s1 (always caught); a moved element changes s2.
 */

#include <stddef.h>
#include <stdint.h>

#include <hdf5.h>
#include <mpi.h>

/* How data moves (ckpt_h5_create / ckpt_h5_open). */
typedef struct ckpt_h5_options {
    /* 1: once the datasets exist (contiguous, space allocated) each rank writes its
     * ranges straight to their bytes in the file (H5Dget_offset) with O_DIRECT pwrite,
     * through an aligned staging buffer, and the unaligned few bytes at either end of a
     * range with plain pwrite; reads likewise, for every dataset that is contiguous
     * little-endian fp32 (others, e.g. from another writer, go through H5Dread). The page
     * cache is bypassed: no copy into it, no dirty-page throttling, a near-free fsync.
     * Where the file system refuses O_DIRECT (any rank), the file falls back to 0.
     * 0: H5Dwrite / H5Dread of hyperslabs through MPI-IO. */
    int direct_io;
    /* 1: MPI-IO collective transfers with collective buffering (two-phase I/O);
     * 0: the HDF5 calls stay collective but each rank writes its own bytes
     * (H5FD_MPIO_INDIVIDUAL_IO): better when every rank's piece is large and
     * contiguous, as FSDP shards are. */
    int collective_io;
    /* Datasets of at least align_threshold bytes start at a multiple of alignment
     * bytes (file-system block / stripe); 0 = HDF5's default packing. */
    uint64_t align_threshold, alignment;
} ckpt_h5_options;

/* Defaults: direct I/O for data written, independent MPI-IO under collective HDF5 calls
 * otherwise, 1 MiB alignment for datasets of at least 1 MiB (benchmarks/RESULTS.md says
 * why); a job's [checkpoint] direct_io, collective_io and alignment keys change them.
 * Local. */
void ckpt_h5_default_options(ckpt_h5_options *opt);

typedef struct ckpt_h5_file {
    hid_t file;
    hid_t dxpl; /* transfer property list of data reads and writes */
    int direct_fd, plain_fd; /* direct_io: this rank's O_DIRECT and plain descriptors
                              * (write-only from create, read-only from open) */
    void *stage;             /* direct_io: aligned staging buffer (CKPT_H5_STAGE bytes) */
    const char *io_mode;     /* "direct I/O", "independent MPI-IO", "collective MPI-IO" */
    MPI_Comm comm;
    int rank, size;
    char path[1024];
} ckpt_h5_file;

/* Creates path for writing, exclusively: a file or link already at path (dangling or
 * not) is refused, never truncated or followed. Callers pick an unpredictable name
 * (io/safe_file.h, safe_file_temp_name) and rename it into place. */
int ckpt_h5_create(ckpt_h5_file *f, const char *path, MPI_Comm comm,
                   const ckpt_h5_options *opt, char *err, size_t errlen);
/* Opens path read-only (opt NULL: the defaults; direct I/O where the file system takes it).
 * Fails with a clear message if it is not an HDF5 file. */
int ckpt_h5_open(ckpt_h5_file *f, const char *path, MPI_Comm comm, const ckpt_h5_options *opt,
                 char *err, size_t errlen);
/* Closes the file (also after a failed write). Safe on a zeroed struct or twice. A
 * failed close of a file opened for writing leaves HDF5 1.10 unable to shut down
 * cleanly (see ckpt_h5_flush): callers should treat it as fatal. */
int ckpt_h5_close(ckpt_h5_file *f, char *err, size_t errlen);

/* Writes every piece of metadata and sets the file's size to its allocated end (a
 * sparse extension). After this, data writes into created datasets and in-place
 * attribute updates need no new metadata space, so when a data write fails (full
 * disk) the close still succeeds: HDF5 1.10 cannot recover from a failed H5Fclose
 * (the file's ID is left dangling and the library crashes when it shuts down). */
int ckpt_h5_flush(ckpt_h5_file *f, char *err, size_t errlen);

/* Creates the group at path (e.g. "/optim/exp_avg"; parents created as needed). */
int ckpt_h5_create_group(ckpt_h5_file *f, const char *path, char *err, size_t errlen);

/* A dataset of the file: fp32, ndim 1 or 2. */
typedef struct ckpt_h5_dataset {
    hid_t id;
    int ndim;
    int64_t shape[2];
    uint64_t numel;
    uint64_t addr;  /* file offset of element 0 when contiguous little-endian fp32 with
                     * storage (direct I/O can move it), else UINT64_MAX */
    char path[256];
} ckpt_h5_dataset;

/* Creates an fp32 dataset (contiguous, space allocated at creation, never filled). */
int ckpt_h5_create_dataset(ckpt_h5_file *f, const char *path, int ndim, const int64_t *shape,
                           ckpt_h5_dataset *d, char *err, size_t errlen);
/* Opens an existing dataset; checks it is a floating-point dataset of 1 or 2 dims
 * reached through hard links only, each object on the way with that one name: a soft or
 * external link, or a second name for a dataset or group (another dataset's data, another
 * group's moments), is refused. */
int ckpt_h5_open_dataset(ckpt_h5_file *f, const char *path, ckpt_h5_dataset *d, char *err,
                         size_t errlen);
void ckpt_h5_close_dataset(ckpt_h5_dataset *d);
/* Whether a link at path exists (all ranks get the same answer). */
int ckpt_h5_exists(ckpt_h5_file *f, const char *path);

/* Writes elements [first, first + count) of the row-major flattened dataset from buf
 * (count fp32). count may be 0 on any rank (that rank only joins the call). */
int ckpt_h5_write_range(ckpt_h5_file *f, ckpt_h5_dataset *d, uint64_t first, uint64_t count,
                        const float *buf, char *err, size_t errlen);
/* Reads elements [first, first + count) into buf, converted to fp32. */
int ckpt_h5_read_range(ckpt_h5_file *f, ckpt_h5_dataset *d, uint64_t first, uint64_t count,
                       float *buf, char *err, size_t errlen);

/* ---- byte datasets: a file kept verbatim (uint8, 1-D, contiguous), with a "checksum"
 * attribute: sum64-pos of its bytes read as 32-bit little-endian words, zero-padded to a
 * multiple of 4 (ckpt_h5_bytes_checksum) ---- */
uint64_t ckpt_h5_bytes_checksum(const void *data, uint64_t n);
/* Creates the dataset (n > 0 bytes) and its checksum attribute of data (the same on every
 * rank): metadata only, for the metadata phase of a save. */
int ckpt_h5_create_bytes(ckpt_h5_file *f, const char *path, const void *data, uint64_t n,
                         char *err, size_t errlen);
/* Writes data into the dataset created by ckpt_h5_create_bytes (rank 0 writes, the others
 * join the call). */
int ckpt_h5_write_bytes(ckpt_h5_file *f, const char *path, const void *data, uint64_t n,
                        char *err, size_t errlen);
/* Reads a byte dataset whole on every rank into malloc'd *data (NUL-terminated, *n
 * bytes), refusing links (as ckpt_h5_open_dataset), another type or rank, and a
 * checksum that differs from its attribute's; *checksum receives it. */
int ckpt_h5_read_bytes(ckpt_h5_file *f, const char *path, char **data, uint64_t *n,
                       uint64_t *checksum, char *err, size_t errlen);

/* ---- attributes of an object (obj = "/" or a dataset's path) ----
 * Writes are collective with the same value on every rank; a second write replaces.
 * Reads refuse an attribute of another class (a float read as an integer, ...), which
 * HDF5 would otherwise convert, clamping or rounding it. */
int ckpt_h5_attr_write_i64(ckpt_h5_file *f, const char *obj, const char *name, int64_t v,
                           char *err, size_t errlen);
int ckpt_h5_attr_write_u64(ckpt_h5_file *f, const char *obj, const char *name, uint64_t v,
                           char *err, size_t errlen);
int ckpt_h5_attr_write_f64(ckpt_h5_file *f, const char *obj, const char *name, double v,
                           char *err, size_t errlen);
int ckpt_h5_attr_write_str(ckpt_h5_file *f, const char *obj, const char *name, const char *v,
                           char *err, size_t errlen);
int ckpt_h5_attr_read_i64(ckpt_h5_file *f, const char *obj, const char *name, int64_t *v,
                          char *err, size_t errlen);
int ckpt_h5_attr_read_u64(ckpt_h5_file *f, const char *obj, const char *name, uint64_t *v,
                          char *err, size_t errlen);
int ckpt_h5_attr_read_f64(ckpt_h5_file *f, const char *obj, const char *name, double *v,
                          char *err, size_t errlen);
/* Reads a string attribute into a malloc'd, NUL-terminated *v (caller frees). */
int ckpt_h5_attr_read_str(ckpt_h5_file *f, const char *obj, const char *name, char **v,
                          char *err, size_t errlen);

/* Names of the datasets directly in group (e.g. "/model"), in HDF5's name order:
 * *names is a malloc'd array of malloc'd strings (ckpt_h5_free_names). */
int ckpt_h5_list(ckpt_h5_file *f, const char *group, char ***names, int *n, char *err,
                 size_t errlen);
void ckpt_h5_free_names(char **names, int n);

/* ---- checksum (local) ---- */
typedef struct ckpt_h5_sum {
    uint64_t s1, s2;
} ckpt_h5_sum;

/* Adds elements [first, first + count) of a dataset, held in x, to the partial sums;
 * returns how many of them are not finite (NaN or infinite: exponent bits all ones), found
 * in the same pass. */
uint64_t ckpt_h5_sum_add(ckpt_h5_sum *acc, const float *x, uint64_t first, uint64_t count);
/* The checksum of a dataset of n elements from its completed sums. */
uint64_t ckpt_h5_sum_final(const ckpt_h5_sum *s, uint64_t n);
/* splitmix64's finaliser (after the golden-ratio increment). */
uint64_t ckpt_h5_mix(uint64_t x);

/* The selection of a flat element range of a row-major 1- or 2-D shape as at most three
 * rectangular blocks (head of a row, whole rows, tail of a row): start/count pairs
 * (row, col) per block, for tests and for ckpt_h5_*_range. Returns the block count.
 * Local and pure. */
int ckpt_h5_range_blocks(int ndim, const int64_t *shape, uint64_t first, uint64_t count,
                         uint64_t start[3][2], uint64_t block[3][2]);

#endif
