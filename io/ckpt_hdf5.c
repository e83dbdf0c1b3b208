/* The checkpoint file format over parallel HDF5 (see ckpt_hdf5.h): MPI-IO file access,
 * flat-range hyperslab transfers, attributes, the sum64-pos checksum, HDF5 error text. */
#include "io/ckpt_hdf5.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/errmsg.h"

/* ---------------------------------------------------------------- errors */

/* What HDF5's error stack says, found by a walk from the API call down to the function
 * that detected the error: the innermost message, and a system or MPI error text when
 * some entry carries one ("error message = 'File too large'", "MPI error string is
 * '...'"), which says more to a user than "file write failed". */
typedef struct h5_walk {
    char desc[512];
    char func[64];
    char cause[256];
} h5_walk;

/* Copies the quoted text after `key` in s into out, if s has it. */
static int quoted_after(const char *s, const char *key, char *out, size_t outlen) {
    const char *p = strstr(s, key);
    if (!p) return 0;
    p += strlen(key);
    const char *end = strchr(p, '\'');
    snprintf(out, outlen, "%.*s", end ? (int)(end - p) : 200, p);
    return 1;
}

static herr_t walk_cb(unsigned n, const H5E_error2_t *e, void *data) {
    h5_walk *w = data;
    (void)n;
    const char *d = e->desc ? e->desc : "";
    /* downward: the last entry visited is the innermost, most specific one */
    snprintf(w->desc, sizeof w->desc, "%s", d);
    snprintf(w->func, sizeof w->func, "%s", e->func_name ? e->func_name : "");
    if (!w->cause[0] && !quoted_after(d, "error message = '", w->cause, sizeof w->cause))
        quoted_after(d, "MPI error string is '", w->cause, sizeof w->cause);
    return 0;
}

/* One line from HDF5's error stack, then the stack cleared. */
static void h5_message(char *out, size_t outlen) {
    h5_walk w = {"", "", ""};
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &w);
    H5Eclear2(H5E_DEFAULT);
    if (!w.desc[0]) {
        snprintf(out, outlen, "unknown HDF5 error");
        return;
    }
    /* a raw system error text: what the caller most needs ("No space left on device") */
    if (w.cause[0] && !strstr(w.desc, w.cause))
        snprintf(out, outlen, "%.150s: %.150s (in %.60s)", w.desc, w.cause, w.func);
    else
        snprintf(out, outlen, "%.300s (in %.60s)", w.desc, w.func);
}

/* "<what>: H5Dwrite failed: <message> (io/ckpt_hdf5.c:123)" into err. sys_errno is
 * errno right after the call: MPI-IO may report a short write as a plain failure, while
 * the write(2) underneath left the reason (ENOSPC, EFBIG, ...) in errno. */
static void h5_fail(char *err, size_t errlen, const char *what, const char *call,
                    const char *file, int line, int sys_errno) {
    char msg[400];
    h5_message(msg, sizeof msg);
    if (sys_errno == ENOSPC || sys_errno == EFBIG || sys_errno == EDQUOT || sys_errno == EIO ||
        sys_errno == EROFS) {
        size_t n = strlen(msg);
        snprintf(msg + n, sizeof msg - n, " [%s]", strerror(sys_errno));
    }
    /* the call's function name: from "H5" to the first '(' of the call text */
    const char *fn = strstr(call, "H5");
    if (!fn) fn = call;
    int fn_len = (int)strcspn(fn, "(");
    snprintf(err, errlen, "%s: %.*s failed: %s (%s:%d)", what, fn_len, fn, msg, file, line);
}

/* Evaluates an HDF5 call once; on a negative result writes err (naming `what`, the call
 * and HDF5's message) and jumps to the function's `fail` label. */
#define H5_CHECK(call)                                                                    \
    do {                                                                                  \
        errno = 0;                                                                        \
        if ((call) < 0) {                                                                 \
            h5_fail(err, errlen, what, #call, __FILE__, __LINE__, errno);                 \
            goto fail;                                                                    \
        }                                                                                 \
    } while (0)

/* Turns off HDF5's printing of its error stack: errors reach the user as one line
 * through err instead. Idempotent. */
static void quiet_hdf5(void) {
    static int done = 0;
    if (done) return;
    H5open();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    done = 1;
}

/* ---------------------------------------------------------------- files */

/* O_DIRECT wants file offsets, lengths and buffer addresses aligned to the device's
 * logical block; 4096 covers every common one. The staging buffer moves 16 MiB at once. */
enum { DIRECT_ALIGN = 4096, CKPT_H5_STAGE = 16 << 20 };

void ckpt_h5_default_options(ckpt_h5_options *opt) {
    opt->direct_io = 1;
    opt->collective_io = 0;
    opt->align_threshold = 1u << 20;
    opt->alignment = 1u << 20;
}

/* File access: MPI-IO over comm with collective metadata (one rank reads metadata and
 * broadcasts it, writes are collective), v1.8 object formats (attributes of any size,
 * readable by every HDF5 since 1.8), alignment. */
static hid_t make_fapl(MPI_Comm comm, const ckpt_h5_options *opt, char *err, size_t errlen,
                       const char *what) {
    hid_t fapl = -1;
    MPI_Info info;
    MPI_Info_create(&info);
    /* ROMIO hints (ignored by OMPIO): big collective buffers, and let the file system
     * decide data sieving for writes, which only helps sparse patterns */
    MPI_Info_set(info, "cb_buffer_size", "16777216");
    MPI_Info_set(info, "romio_ds_write", "disable");
    MPI_Info_set(info, "romio_cb_write", opt->collective_io ? "enable" : "automatic");
    H5_CHECK(fapl = H5Pcreate(H5P_FILE_ACCESS));
    H5_CHECK(H5Pset_fapl_mpio(fapl, comm, info));
    H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, 1));
    H5_CHECK(H5Pset_coll_metadata_write(fapl, 1));
    H5_CHECK(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18));
    if (opt->alignment > 1)
        H5_CHECK(H5Pset_alignment(fapl, opt->align_threshold, opt->alignment));
    /* metadata in blocks of 1 MiB, not scattered between the datasets' data */
    H5_CHECK(H5Pset_meta_block_size(fapl, 1u << 20));
    MPI_Info_free(&info);
    return fapl;
fail:
    MPI_Info_free(&info);
    if (fapl >= 0) H5Pclose(fapl);
    return -1;
}

static int init_file(ckpt_h5_file *f, const char *path, MPI_Comm comm,
                     const ckpt_h5_options *opt, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    f->file = -1;
    f->dxpl = -1;
    f->direct_fd = f->plain_fd = -1;
    f->io_mode = opt->collective_io ? "collective MPI-IO" : "independent MPI-IO";
    f->comm = comm;
    MPI_Comm_rank(comm, &f->rank);
    MPI_Comm_size(comm, &f->size);
    if ((size_t)snprintf(f->path, sizeof f->path, "%s", path) >= sizeof f->path) {
        io_set_err(err, errlen, "%.200s...: checkpoint path too long (%zu characters, at most %zu)",
                path, strlen(path), sizeof f->path - 1);
        return -1;
    }
    const char *what = f->path;
    H5_CHECK(f->dxpl = H5Pcreate(H5P_DATASET_XFER));
    H5_CHECK(H5Pset_dxpl_mpio(f->dxpl, H5FD_MPIO_COLLECTIVE));
    if (!opt->collective_io)
        H5_CHECK(H5Pset_dxpl_mpio_collective_opt(f->dxpl, H5FD_MPIO_INDIVIDUAL_IO));
    return 0;
fail:
    return -1;
}

/* Direct I/O descriptors for f (flags O_WRONLY or O_RDONLY): every rank must manage
 * O_DIRECT, or none uses it (tmpfs before Linux 6.6 and some network file systems
 * refuse it). Collective. */
static void open_direct(ckpt_h5_file *f, int flags) {
    /* writing: the file ckpt_h5_create made, never a link put in its place */
    if (flags != O_RDONLY) flags |= O_NOFOLLOW;
    f->direct_fd = open(f->path, flags | O_DIRECT | O_CLOEXEC);
    f->plain_fd = open(f->path, flags | O_CLOEXEC);
    int all = f->direct_fd >= 0 && f->plain_fd >= 0 &&
              posix_memalign(&f->stage, DIRECT_ALIGN, CKPT_H5_STAGE) == 0;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, f->comm);
    if (all) {
        f->io_mode = "direct I/O";
        return;
    }
    if (f->direct_fd >= 0) close(f->direct_fd);
    if (f->plain_fd >= 0) close(f->plain_fd);
    free(f->stage);
    f->stage = NULL;
    f->direct_fd = f->plain_fd = -1;
}

/* The end of ckpt_h5_create and ckpt_h5_open, which H5Fcreate or H5Fopen reached when
 * f->file >= 0: closes fapl, and then opens the direct I/O descriptors (direct_flags
 * O_WRONLY or O_RDONLY; -1: none) or, on failure, drops the transfer list. */
static int file_opened(ckpt_h5_file *f, hid_t fapl, int direct_flags) {
    if (fapl >= 0) H5Pclose(fapl);
    if (f->file >= 0) {
        if (direct_flags >= 0) open_direct(f, direct_flags);
        return 0;
    }
    if (f->dxpl >= 0) H5Pclose(f->dxpl);
    f->dxpl = -1;
    return -1;
}

int ckpt_h5_create(ckpt_h5_file *f, const char *path, MPI_Comm comm,
                   const ckpt_h5_options *opt, char *err, size_t errlen) {
    quiet_hdf5();
    const char *what = path;
    hid_t fapl = -1;
    if (init_file(f, path, comm, opt, err, errlen) != 0) goto fail;
    if ((fapl = make_fapl(comm, opt, err, errlen, what)) < 0) goto fail;
    /* exclusive: MPI_MODE_EXCL, with which Open MPI's rank 0 creates the file
     * O_CREAT|O_EXCL (refusing any name that exists, a dangling link included) and the
     * other ranks open what it created */
    errno = 0;
    f->file = H5Fcreate(path, H5F_ACC_EXCL, H5P_DEFAULT, fapl);
    if (f->file < 0) {
        const int sys_errno = errno;
        struct stat sb;
        h5_fail(err, errlen, what, "H5Fcreate", __FILE__, __LINE__, sys_errno);
        if (lstat(path, &sb) == 0)
            io_set_err(err, errlen, "%s already exists (%s): a checkpoint file is created "
                    "exclusively, never truncated or written through a link", path,
                    S_ISLNK(sb.st_mode) ? "a symbolic link" : "a file");
        goto fail;
    }
fail:
    return file_opened(f, fapl, opt->direct_io ? O_WRONLY : -1);
}

int ckpt_h5_open(ckpt_h5_file *f, const char *path, MPI_Comm comm, const ckpt_h5_options *how,
                 char *err, size_t errlen) {
    quiet_hdf5();
    const char *what = path;
    hid_t fapl = -1;
    ckpt_h5_options opt;
    if (how) opt = *how;
    else ckpt_h5_default_options(&opt);
    if (init_file(f, path, comm, &opt, err, errlen) != 0) goto fail;
    if (access(path, R_OK) != 0) {
        io_set_err(err, errlen, "%s: cannot read checkpoint: %s", path, strerror(errno));
        goto fail;
    }
    if ((fapl = make_fapl(comm, &opt, err, errlen, what)) < 0) goto fail;
    f->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (f->file < 0) {
        char msg[400];
        h5_message(msg, sizeof msg);
        io_set_err(err, errlen, "%s: not a readable HDF5 file (H5Fopen: %s)", path, msg);
        goto fail;
    }
fail:
    return file_opened(f, fapl, opt.direct_io ? O_RDONLY : -1);
}

int ckpt_h5_close(ckpt_h5_file *f, char *err, size_t errlen) {
    const char *what = f->path;
    int rc = 0;
    if (f->direct_fd >= 0) close(f->direct_fd);
    if (f->plain_fd >= 0) close(f->plain_fd);
    f->direct_fd = f->plain_fd = -1;
    free(f->stage);
    f->stage = NULL;
    if (f->dxpl > 0) H5Pclose(f->dxpl);
    f->dxpl = -1;
    if (f->file > 0) {
        hid_t file = f->file;
        f->file = -1;
        H5_CHECK(H5Fclose(file));
    }
    return rc;
fail:
    return -1;
}

int ckpt_h5_flush(ckpt_h5_file *f, char *err, size_t errlen) {
    const char *what = f->path;
    H5_CHECK(H5Fflush(f->file, H5F_SCOPE_GLOBAL));
    return 0;
fail:
    return -1;
}

int ckpt_h5_create_group(ckpt_h5_file *f, const char *path, char *err, size_t errlen) {
    const char *what = path;
    hid_t lcpl = -1, g = -1;
    H5_CHECK(lcpl = H5Pcreate(H5P_LINK_CREATE));
    H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
    H5_CHECK(g = H5Gcreate2(f->file, path, lcpl, H5P_DEFAULT, H5P_DEFAULT));
    H5Gclose(g);
    H5Pclose(lcpl);
    return 0;
fail:
    if (lcpl >= 0) H5Pclose(lcpl);
    return -1;
}

/* ---------------------------------------------------------------- datasets */

int ckpt_h5_create_dataset(ckpt_h5_file *f, const char *path, int ndim, const int64_t *shape,
                           ckpt_h5_dataset *d, char *err, size_t errlen) {
    const char *what = path;
    hid_t space = -1, dcpl = -1;
    int rc = -1;
    memset(d, 0, sizeof *d);
    d->id = -1;
    d->addr = UINT64_MAX;
    if (ndim < 1 || ndim > 2) {
        io_set_err(err, errlen, "%s: %d dimensions (checkpoint datasets have 1 or 2)", path, ndim);
        return -1;
    }
    hsize_t dims[2];
    d->ndim = ndim;
    d->numel = 1;
    for (int i = 0; i < ndim; i++) {
        dims[i] = (hsize_t)shape[i];
        d->shape[i] = shape[i];
        d->numel *= (uint64_t)shape[i];
    }
    snprintf(d->path, sizeof d->path, "%s", path);
    H5_CHECK(space = H5Screate_simple(ndim, dims, NULL));
    H5_CHECK(dcpl = H5Pcreate(H5P_DATASET_CREATE));
    H5_CHECK(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
    /* every byte is written by some rank: writing a fill value first would double the
     * I/O. Early allocation is what parallel HDF5 requires anyway. */
    H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
    H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
    H5_CHECK(d->id = H5Dcreate2(f->file, path, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl,
                                H5P_DEFAULT));
    d->addr = H5Dget_offset(d->id); /* contiguous, allocated early: one run of bytes */
    if (d->addr == HADDR_UNDEF) d->addr = UINT64_MAX, H5Eclear2(H5E_DEFAULT);
    rc = 0;
fail: /* and done */
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    return rc;
}

/* Every component of path is a hard link to an object with no other name. */
static int plain_links(ckpt_h5_file *f, const char *path, char *err, size_t errlen) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        const char c = *p;
        *p = '\0';
        H5L_info_t li;
        H5O_info_t oi;
        const char *bad = NULL;
        if (H5Lget_info(f->file, buf, &li, H5P_DEFAULT) < 0) bad = "cannot be inspected";
        else if (li.type == H5L_TYPE_SOFT) bad = "is a soft link";
        else if (li.type == H5L_TYPE_EXTERNAL) bad = "is an external link";
        else if (li.type != H5L_TYPE_HARD) bad = "is a user-defined link";
        else if (H5Oget_info_by_name2(f->file, buf, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0)
            bad = "cannot be inspected";
        if (bad) {
            H5Eclear2(H5E_DEFAULT);
            io_set_err(err, errlen, "%s: %s %s: a checkpoint holds no links (refusing it)", f->path,
                    buf, bad);
            return -1;
        }
        if (oi.rc != 1) {
            io_set_err(err, errlen, "%s: %s is one object under %u names (hard links): a "
                    "checkpoint holds none (refusing it)", f->path, buf, oi.rc);
            return -1;
        }
        if (!c) return 0;
        *p = c;
    }
}

int ckpt_h5_open_dataset(ckpt_h5_file *f, const char *path, ckpt_h5_dataset *d, char *err,
                         size_t errlen) {
    const char *what = path;
    hid_t space = -1, type = -1;
    memset(d, 0, sizeof *d);
    d->id = -1;
    d->addr = UINT64_MAX;
    snprintf(d->path, sizeof d->path, "%s", path);
    if (!ckpt_h5_exists(f, path)) {
        io_set_err(err, errlen, "%s: checkpoint has no dataset %s", f->path, path);
        return -1;
    }
    if (plain_links(f, path, err, errlen) != 0) return -1;
    H5_CHECK(d->id = H5Dopen2(f->file, path, H5P_DEFAULT));
    H5_CHECK(type = H5Dget_type(d->id));
    if (H5Tget_class(type) != H5T_FLOAT) {
        io_set_err(err, errlen, "%s: dataset %s is not floating-point", f->path, path);
        goto fail;
    }
    H5_CHECK(space = H5Dget_space(d->id));
    int nd = H5Sget_simple_extent_ndims(space);
    if (nd < 1 || nd > 2) {
        io_set_err(err, errlen, "%s: dataset %s has %d dimensions (expected 1 or 2)", f->path, path,
                nd);
        goto fail;
    }
    hsize_t dims[2];
    H5_CHECK(H5Sget_simple_extent_dims(space, dims, NULL));
    d->ndim = nd;
    d->numel = 1;
    for (int i = 0; i < nd; i++) {
        d->shape[i] = (int64_t)dims[i];
        d->numel *= dims[i];
    }
    /* the bytes can be read directly only where they are plain little-endian fp32 in one
     * run (what shardlm writes); anything else goes through H5Dread's conversion */
    d->addr = UINT64_MAX;
    hid_t dcpl = H5Dget_create_plist(d->id);
    if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl) == 0 &&
        H5Tequal(type, H5T_IEEE_F32LE) > 0) {
        haddr_t a = H5Dget_offset(d->id);
        if (a != HADDR_UNDEF) d->addr = a;
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    H5Eclear2(H5E_DEFAULT);
    H5Sclose(space);
    H5Tclose(type);
    return 0;
fail:
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (d->id >= 0) H5Dclose(d->id);
    d->id = -1;
    return -1;
}

void ckpt_h5_close_dataset(ckpt_h5_dataset *d) {
    if (d->id >= 0) H5Dclose(d->id);
    d->id = -1;
}

int ckpt_h5_exists(ckpt_h5_file *f, const char *path) {
    /* every link of the path must exist for H5Lexists not to fail */
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (H5Lexists(f->file, buf, H5P_DEFAULT) <= 0) {
                H5Eclear2(H5E_DEFAULT);
                return 0;
            }
            *p = c;
            if (!c) break;
        }
    }
    return 1;
}

int ckpt_h5_range_blocks(int ndim, const int64_t *shape, uint64_t first, uint64_t count,
                         uint64_t start[3][2], uint64_t block[3][2]) {
    if (count == 0) return 0;
    if (ndim == 1) {
        start[0][0] = first, start[0][1] = 0;
        block[0][0] = count, block[0][1] = 1;
        return 1;
    }
    const uint64_t C = (uint64_t)shape[1], end = first + count;
    uint64_t r0 = first / C, c0 = first % C, r1 = end / C, c1 = end % C;
    int n = 0;
    if (r0 == r1) { /* inside one row */
        start[0][0] = r0, start[0][1] = c0;
        block[0][0] = 1, block[0][1] = c1 - c0;
        return 1;
    }
    if (c0 > 0) { /* the tail of the first row */
        start[n][0] = r0, start[n][1] = c0;
        block[n][0] = 1, block[n][1] = C - c0;
        n++, r0++;
    }
    if (r1 > r0) { /* whole rows */
        start[n][0] = r0, start[n][1] = 0;
        block[n][0] = r1 - r0, block[n][1] = C;
        n++;
    }
    if (c1 > 0) { /* the head of the last row */
        start[n][0] = r1, start[n][1] = 0;
        block[n][0] = 1, block[n][1] = c1;
        n++;
    }
    return n;
}

/* Selects [first, first + count) of the dataset in its file space (none when count is
 * 0) and a matching 1-D memory space. */
static int select_range(ckpt_h5_dataset *d, uint64_t first, uint64_t count, hid_t *fspace,
                        hid_t *mspace, char *err, size_t errlen) {
    const char *what = d->path;
    *fspace = *mspace = -1;
    if (first + count > d->numel) {
        io_set_err(err, errlen, "%s: elements [%llu, %llu) outside the dataset's %llu", d->path,
                (unsigned long long)first, (unsigned long long)(first + count),
                (unsigned long long)d->numel);
        return -1;
    }
    H5_CHECK(*fspace = H5Dget_space(d->id));
    hsize_t mdim = count ? count : 1;
    H5_CHECK(*mspace = H5Screate_simple(1, &mdim, NULL));
    if (count == 0) {
        H5_CHECK(H5Sselect_none(*fspace));
        H5_CHECK(H5Sselect_none(*mspace));
        return 0;
    }
    uint64_t start[3][2], block[3][2];
    int n = ckpt_h5_range_blocks(d->ndim, d->shape, first, count, start, block);
    for (int b = 0; b < n; b++) {
        hsize_t st[2] = {start[b][0], start[b][1]}, cnt[2] = {block[b][0], block[b][1]};
        H5_CHECK(H5Sselect_hyperslab(*fspace, b == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, st,
                                     NULL, cnt, NULL));
    }
    return 0;
fail:
    if (*fspace >= 0) H5Sclose(*fspace);
    if (*mspace >= 0) H5Sclose(*mspace);
    *fspace = *mspace = -1;
    return -1;
}

/* pwrite (writing) or pread of all n bytes at off, retrying short transfers; -1 with
 * errno on failure (EIO where the file is shorter than its metadata says). */
static int pio_all(int fd, char *p, size_t n, uint64_t off, int writing) {
    while (n > 0) {
        ssize_t r = writing ? pwrite(fd, p, n, (off_t)off) : pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = EIO;
            return -1;
        }
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

/* The direct path of ckpt_h5_write_range and ckpt_h5_read_range: bytes [a, b) of the file
 * from or into buf; the 4096-aligned middle through the staging buffer with O_DIRECT, the
 * ends plainly. */
static int direct_range(ckpt_h5_file *f, ckpt_h5_dataset *d, uint64_t first, uint64_t count,
                        char *buf, int writing, char *err, size_t errlen) {
    const char *plain = writing ? "pwrite" : "pread", *step = plain;
    const uint64_t a = d->addr + 4 * first, b = a + 4 * count;
    uint64_t ma = (a + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    uint64_t mb = b / DIRECT_ALIGN * DIRECT_ALIGN;
    if (ma >= mb) ma = mb = b; /* nothing aligned inside: all of it plainly */
    if (ma > a && pio_all(f->plain_fd, buf, ma - a, a, writing) != 0) goto fail_sys;
    for (uint64_t o = ma; o < mb; o += CKPT_H5_STAGE) {
        size_t n = mb - o < CKPT_H5_STAGE ? (size_t)(mb - o) : CKPT_H5_STAGE;
        if (writing) memcpy(f->stage, buf + (o - a), n);
        step = writing ? "pwrite (O_DIRECT)" : "pread (O_DIRECT)";
        if (pio_all(f->direct_fd, f->stage, n, o, writing) != 0) goto fail_sys;
        if (!writing) memcpy(buf + (o - a), f->stage, n);
    }
    step = plain;
    if (b > mb && pio_all(f->plain_fd, buf + (mb - a), b - mb, mb, writing) != 0) goto fail_sys;
    return 0;
fail_sys:
    snprintf(err, errlen, "%s: %s of %s failed: %s", d->path, step, f->path, strerror(errno));
    return -1;
}

/* Elements [first, first+count) must lie inside the dataset. */
static int check_range(const ckpt_h5_dataset *d, uint64_t first, uint64_t count, char *err,
                       size_t errlen) {
    if (first + count <= d->numel) return 0;
    snprintf(err, errlen, "%s: elements [%llu, %llu) outside the dataset's %llu", d->path,
             (unsigned long long)first, (unsigned long long)(first + count),
             (unsigned long long)d->numel);
    return -1;
}

/* Elements [first, first+count) of d from buf (writing) or into it: directly where the
 * file has direct I/O and d its offset, else H5Dwrite / H5Dread of a hyperslab. */
static int transfer_range(ckpt_h5_file *f, ckpt_h5_dataset *d, uint64_t first, uint64_t count,
                          float *buf, int writing, char *err, size_t errlen) {
    const char *what = d->path;
    if (f->direct_fd >= 0 && d->addr != UINT64_MAX) {
        if (check_range(d, first, count, err, errlen) != 0) return -1;
        return count ? direct_range(f, d, first, count, (char *)buf, writing, err, errlen) : 0;
    }
    hid_t fs, ms;
    float dummy = 0; /* HDF5 wants a buffer even for an empty selection */
    if (select_range(d, first, count, &fs, &ms, err, errlen) != 0) return -1;
    int rc = -1;
    if (writing) H5_CHECK(H5Dwrite(d->id, H5T_NATIVE_FLOAT, ms, fs, f->dxpl, count ? buf : &dummy));
    else H5_CHECK(H5Dread(d->id, H5T_NATIVE_FLOAT, ms, fs, f->dxpl, count ? buf : &dummy));
    rc = 0;
fail: /* and done */
    H5Sclose(fs);
    H5Sclose(ms);
    return rc;
}

int ckpt_h5_write_range(ckpt_h5_file *f, ckpt_h5_dataset *d, uint64_t first, uint64_t count,
                        const float *buf, char *err, size_t errlen) {
    return transfer_range(f, d, first, count, (float *)buf, 1, err, errlen); /* only read */
}

int ckpt_h5_read_range(ckpt_h5_file *f, ckpt_h5_dataset *d, uint64_t first, uint64_t count,
                       float *buf, char *err, size_t errlen) {
    return transfer_range(f, d, first, count, buf, 0, err, errlen);
}

/* ---------------------------------------------------------------- attributes */

/* Writes a scalar attribute of file type ftype from memory type mtype. An existing
 * numeric attribute is overwritten in place: its bytes are already allocated in the
 * file, so the update needs no new space (see ckpt_h5_flush). */
static int attr_write(ckpt_h5_file *f, const char *obj, const char *name, hid_t ftype,
                      hid_t mtype, const void *v, char *err, size_t errlen) {
    char what[400];
    snprintf(what, sizeof what, "%.200s: attribute %.80s of %.100s", f->path, name, obj);
    hid_t space = -1, a = -1;
    int rc = -1;
    htri_t exists;
    H5_CHECK(exists = H5Aexists_by_name(f->file, obj, name, H5P_DEFAULT));
    if (exists && H5Tget_class(ftype) != H5T_STRING) {
        hid_t o;
        H5_CHECK(o = H5Oopen(f->file, obj, H5P_DEFAULT));
        H5_CHECK(a = H5Aopen(o, name, H5P_DEFAULT));
        H5_CHECK(H5Awrite(a, mtype, v));
        H5Aclose(a);
        H5Oclose(o);
        return 0;
    }
    if (exists) H5_CHECK(H5Adelete_by_name(f->file, obj, name, H5P_DEFAULT));
    H5_CHECK(space = H5Screate(H5S_SCALAR));
    H5_CHECK(a = H5Acreate_by_name(f->file, obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT,
                                   H5P_DEFAULT));
    H5_CHECK(H5Awrite(a, mtype, v));
    rc = 0;
fail: /* and done */
    if (a >= 0) H5Aclose(a);
    if (space >= 0) H5Sclose(space);
    return rc;
}

int ckpt_h5_attr_write_i64(ckpt_h5_file *f, const char *obj, const char *name, int64_t v,
                           char *err, size_t errlen) {
    long long x = v;
    return attr_write(f, obj, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, &x, err, errlen);
}

int ckpt_h5_attr_write_u64(ckpt_h5_file *f, const char *obj, const char *name, uint64_t v,
                           char *err, size_t errlen) {
    unsigned long long x = v;
    return attr_write(f, obj, name, H5T_STD_U64LE, H5T_NATIVE_ULLONG, &x, err, errlen);
}

int ckpt_h5_attr_write_f64(ckpt_h5_file *f, const char *obj, const char *name, double v,
                           char *err, size_t errlen) {
    return attr_write(f, obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v, err, errlen);
}

int ckpt_h5_attr_write_str(ckpt_h5_file *f, const char *obj, const char *name, const char *v,
                           char *err, size_t errlen) {
    char what[400];
    snprintf(what, sizeof what, "%.200s: attribute %.80s of %.100s", f->path, name, obj);
    hid_t type = -1;
    /* fixed length (h5py reads it as bytes, h5dump as a string); at least one byte */
    H5_CHECK(type = H5Tcopy(H5T_C_S1));
    H5_CHECK(H5Tset_size(type, strlen(v) + 1));
    H5_CHECK(H5Tset_strpad(type, H5T_STR_NULLTERM));
    H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
    int rc = attr_write(f, obj, name, type, type, v, err, errlen);
    H5Tclose(type);
    return rc;
fail:
    if (type >= 0) H5Tclose(type);
    return -1;
}

static int attr_open(ckpt_h5_file *f, const char *obj, const char *name, hid_t *a, char *err,
                     size_t errlen) {
    htri_t exists = H5Aexists_by_name(f->file, obj, name, H5P_DEFAULT);
    if (exists <= 0) {
        H5Eclear2(H5E_DEFAULT);
        io_set_err(err, errlen, "%s: %s has no attribute '%s' (not a shardlm checkpoint?)",
                f->path, obj, name);
        return -1;
    }
    *a = H5Aopen_by_name(f->file, obj, name, H5P_DEFAULT, H5P_DEFAULT);
    if (*a < 0) {
        char msg[400];
        h5_message(msg, sizeof msg);
        io_set_err(err, errlen, "%s: attribute %s of %s: %s", f->path, name, obj, msg);
        return -1;
    }
    return 0;
}

static int attr_read(ckpt_h5_file *f, const char *obj, const char *name, hid_t mtype, void *v,
                     char *err, size_t errlen) {
    char what[400];
    snprintf(what, sizeof what, "%.200s: attribute %.80s of %.100s", f->path, name, obj);
    hid_t a = -1, type = -1;
    if (attr_open(f, obj, name, &a, err, errlen) != 0) return -1;
    H5_CHECK(type = H5Aget_type(a));
    if (H5Tget_class(type) != H5Tget_class(mtype)) {
        io_set_err(err, errlen, "%s: %s, not %s (a corrupt or edited checkpoint)", what,
                H5Tget_class(type) == H5T_FLOAT ? "a floating-point number"
                : H5Tget_class(type) == H5T_INTEGER ? "an integer" : "not a number",
                H5Tget_class(mtype) == H5T_FLOAT ? "a floating-point number" : "an integer");
        goto fail;
    }
    if (H5Tget_class(mtype) == H5T_INTEGER && H5Tget_sign(type) != H5Tget_sign(mtype)) {
        /* HDF5 would clamp (-1 read as unsigned is 0): read it as stored, then refuse what
         * the 64-bit type asked for cannot hold */
        long long sv = 0;
        unsigned long long uv = 0;
        const int is_signed = H5Tget_sign(type) == H5T_SGN_2;
        H5_CHECK(H5Aread(a, is_signed ? H5T_NATIVE_LLONG : H5T_NATIVE_ULLONG,
                         is_signed ? (void *)&sv : (void *)&uv));
        if (is_signed && sv < 0) {
            io_set_err(err, errlen, "%s: %lld is negative (a corrupt or edited checkpoint)", what, sv);
            goto fail;
        }
        if (!is_signed && uv > (unsigned long long)LLONG_MAX) {
            io_set_err(err, errlen, "%s: %llu is beyond 2^63 (a corrupt or edited checkpoint)", what,
                    uv);
            goto fail;
        }
        if (is_signed) *(unsigned long long *)v = (unsigned long long)sv;
        else *(long long *)v = (long long)uv;
    } else {
        H5_CHECK(H5Aread(a, mtype, v));
    }
    H5Tclose(type);
    H5Aclose(a);
    return 0;
fail:
    if (type >= 0) H5Tclose(type);
    H5Aclose(a);
    return -1;
}

int ckpt_h5_attr_read_i64(ckpt_h5_file *f, const char *obj, const char *name, int64_t *v,
                          char *err, size_t errlen) {
    long long x = 0;
    int rc = attr_read(f, obj, name, H5T_NATIVE_LLONG, &x, err, errlen);
    *v = x;
    return rc;
}

int ckpt_h5_attr_read_u64(ckpt_h5_file *f, const char *obj, const char *name, uint64_t *v,
                          char *err, size_t errlen) {
    unsigned long long x = 0;
    int rc = attr_read(f, obj, name, H5T_NATIVE_ULLONG, &x, err, errlen);
    *v = x;
    return rc;
}

int ckpt_h5_attr_read_f64(ckpt_h5_file *f, const char *obj, const char *name, double *v,
                          char *err, size_t errlen) {
    return attr_read(f, obj, name, H5T_NATIVE_DOUBLE, v, err, errlen);
}

int ckpt_h5_attr_read_str(ckpt_h5_file *f, const char *obj, const char *name, char **v,
                          char *err, size_t errlen) {
    char what[400];
    snprintf(what, sizeof what, "%.200s: attribute %.80s of %.100s", f->path, name, obj);
    hid_t a = -1, type = -1, mtype = -1;
    *v = NULL;
    if (attr_open(f, obj, name, &a, err, errlen) != 0) return -1;
    H5_CHECK(type = H5Aget_type(a));
    if (H5Tget_class(type) != H5T_STRING) {
        io_set_err(err, errlen, "%s: not a string", what);
        goto fail;
    }
    if (H5Tis_variable_str(type) > 0) {
        char *s = NULL;
        H5_CHECK(mtype = H5Tcopy(H5T_C_S1));
        H5_CHECK(H5Tset_size(mtype, H5T_VARIABLE));
        H5_CHECK(H5Aread(a, mtype, &s));
        *v = strdup(s ? s : "");
        H5free_memory(s);
    } else {
        size_t n = H5Tget_size(type);
        *v = calloc(n + 1, 1);
        if (!*v) {
            io_set_err(err, errlen, "%s: out of memory", what);
            goto fail;
        }
        H5_CHECK(H5Aread(a, type, *v));
    }
    if (mtype >= 0) H5Tclose(mtype);
    H5Tclose(type);
    H5Aclose(a);
    return 0;
fail:
    free(*v);
    *v = NULL;
    if (mtype >= 0) H5Tclose(mtype);
    if (type >= 0) H5Tclose(type);
    H5Aclose(a);
    return -1;
}

/* ---------------------------------------------------------------- listing */

int ckpt_h5_list(ckpt_h5_file *f, const char *group, char ***names, int *n, char *err,
                 size_t errlen) {
    const char *what = group;
    hid_t g = -1;
    *names = NULL;
    *n = 0;
    if (!ckpt_h5_exists(f, group)) {
        io_set_err(err, errlen, "%s: no group %s (not a shardlm checkpoint?)", f->path, group);
        return -1;
    }
    H5G_info_t info;
    H5_CHECK(g = H5Gopen2(f->file, group, H5P_DEFAULT));
    H5_CHECK(H5Gget_info(g, &info));
    *names = calloc(info.nlinks ? info.nlinks : 1, sizeof(char *));
    if (!*names) {
        io_set_err(err, errlen, "%s: out of memory", group);
        goto fail;
    }
    for (hsize_t i = 0; i < info.nlinks; i++) {
        ssize_t len;
        H5_CHECK(len = H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, NULL, 0,
                                          H5P_DEFAULT));
        char *s = malloc((size_t)len + 1);
        if (!s) {
            io_set_err(err, errlen, "%s: out of memory", group);
            goto fail;
        }
        (*names)[(*n)++] = s;
        H5_CHECK(H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, s, (size_t)len + 1,
                                    H5P_DEFAULT));
    }
    H5Gclose(g);
    return 0;
fail:
    if (g >= 0) H5Gclose(g);
    ckpt_h5_free_names(*names, *n);
    *names = NULL;
    *n = 0;
    return -1;
}

void ckpt_h5_free_names(char **names, int n) {
    if (!names) return;
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* ---------------------------------------------------------------- checksum */

uint64_t ckpt_h5_bytes_checksum(const void *data, uint64_t n) {
    /* whole words, then the tail zero-padded: the words of the padded bytes */
    ckpt_h5_sum s = {0, 0};
    const uint64_t whole = n / 4;
    ckpt_h5_sum_add(&s, data, 0, whole);
    if (n % 4) {
        unsigned char tail[4] = {0, 0, 0, 0};
        memcpy(tail, (const unsigned char *)data + 4 * whole, n % 4);
        ckpt_h5_sum_add(&s, (const float *)(const void *)tail, whole, 1);
    }
    return ckpt_h5_sum_final(&s, (n + 3) / 4);
}

int ckpt_h5_create_bytes(ckpt_h5_file *f, const char *path, const void *data, uint64_t n,
                         char *err, size_t errlen) {
    const char *what = path;
    hid_t space = -1, dcpl = -1, d = -1;
    const hsize_t dim = n;
    H5_CHECK(space = H5Screate_simple(1, &dim, NULL));
    H5_CHECK(dcpl = H5Pcreate(H5P_DATASET_CREATE));
    H5_CHECK(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
    H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
    H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
    H5_CHECK(d = H5Dcreate2(f->file, path, H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(space);
    return ckpt_h5_attr_write_u64(f, path, "checksum", ckpt_h5_bytes_checksum(data, n), err,
                                  errlen);
fail:
    if (d >= 0) H5Dclose(d);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    return -1;
}

int ckpt_h5_write_bytes(ckpt_h5_file *f, const char *path, const void *data, uint64_t n,
                        char *err, size_t errlen) {
    const char *what = path;
    hid_t d = -1, fs = -1, ms = -1;
    int rc = -1;
    const hsize_t dim = f->rank == 0 ? n : 0;
    H5_CHECK(d = H5Dopen2(f->file, path, H5P_DEFAULT));
    H5_CHECK(fs = H5Dget_space(d));
    H5_CHECK(ms = H5Screate_simple(1, &dim, NULL));
    if (f->rank != 0) H5_CHECK(H5Sselect_none(fs));
    unsigned char dummy = 0;
    H5_CHECK(H5Dwrite(d, H5T_NATIVE_UCHAR, ms, fs, f->dxpl, f->rank == 0 ? data : &dummy));
    rc = 0;
fail: /* and done */
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    if (d >= 0) H5Dclose(d);
    return rc;
}

int ckpt_h5_read_bytes(ckpt_h5_file *f, const char *path, char **data, uint64_t *n,
                       uint64_t *checksum, char *err, size_t errlen) {
    const char *what = path;
    hid_t d = -1, space = -1, type = -1;
    *data = NULL;
    *n = 0;
    if (!ckpt_h5_exists(f, path)) {
        io_set_err(err, errlen, "%s: checkpoint has no dataset %s", f->path, path);
        return -1;
    }
    if (plain_links(f, path, err, errlen) != 0) return -1;
    H5_CHECK(d = H5Dopen2(f->file, path, H5P_DEFAULT));
    H5_CHECK(type = H5Dget_type(d));
    H5_CHECK(space = H5Dget_space(d));
    hsize_t dim = 0;
    if (H5Tget_class(type) != H5T_INTEGER || H5Tget_size(type) != 1 ||
        H5Tget_sign(type) != H5T_SGN_NONE || H5Sget_simple_extent_ndims(space) != 1) {
        io_set_err(err, errlen, "%s: dataset %s is not a 1-D byte (uint8) dataset", f->path, path);
        goto fail;
    }
    H5_CHECK(H5Sget_simple_extent_dims(space, &dim, NULL));
    *data = malloc((size_t)dim + 1);
    if (!*data) {
        io_set_err(err, errlen, "%s: %s: out of memory for %llu bytes", f->path, path,
                (unsigned long long)dim);
        goto fail;
    }
    H5_CHECK(H5Dread(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, f->dxpl, *data));
    (*data)[dim] = '\0';
    *n = dim;
    H5Sclose(space);
    H5Tclose(type);
    H5Dclose(d);
    d = space = type = -1;
    uint64_t stored = 0;
    if (ckpt_h5_attr_read_u64(f, path, "checksum", &stored, err, errlen) != 0) goto fail;
    *checksum = ckpt_h5_bytes_checksum(*data, *n);
    if (*checksum != stored) {
        io_set_err(err, errlen, "%s: dataset %s is corrupt: checksum 0x%016llx, stored 0x%016llx",
                f->path, path, (unsigned long long)*checksum, (unsigned long long)stored);
        goto fail;
    }
    return 0;
fail:
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (d >= 0) H5Dclose(d);
    free(*data);
    *data = NULL;
    *n = 0;
    return -1;
}

uint64_t ckpt_h5_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t ckpt_h5_sum_add(ckpt_h5_sum *acc, const float *x, uint64_t first, uint64_t count) {
    /* sum_i (first + i)·w_i = first·sum_i w_i + sum_i i·w_i, so the loop does not
     * depend on where the range starts; memcpy reads the bits without aliasing games */
    uint64_t s1 = 0, s2 = 0, nonfinite = 0;
    const unsigned char *p = (const unsigned char *)x;
    for (uint64_t i = 0; i < count; i++) {
        uint32_t w;
        memcpy(&w, p + 4 * i, 4);
        s1 += w;
        s2 += i * (uint64_t)w;
        nonfinite += (w & 0x7f800000u) == 0x7f800000u;
    }
    acc->s1 += s1;
    acc->s2 += s2 + first * s1;
    return nonfinite;
}

uint64_t ckpt_h5_sum_final(const ckpt_h5_sum *s, uint64_t n) {
    return ckpt_h5_mix(s->s1 ^ ckpt_h5_mix(s->s2 + n));
}
