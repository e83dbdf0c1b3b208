/* Reading a checkpoint: opening it with every check of its state, the kept Hugging Face
 * files, and loading its tensors into the engine, each rank the ranges its shard needs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/errmsg.h"
#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "src/base/agree.h"
#include "src/base/shard.h"
#include "src/ckpt/ckpt_internal.h"
#include "src/ckpt/tensors.h"

/* Each file of the /hf group (format 3), read whole and checked against its checksum,
 * into out (where out lacks it; NULL: only checked) and, with entries, as the state
 * checksum sees it (*n_entries grows; entries has room for HF_FILES_MAX more). A name
 * that is not a file shardlm keeps is refused. */
static int read_hf_group(ckpt_h5_file *f, hf_files *out, ckpt_ds_entry *entries, int *n_entries,
                         char *err, size_t errlen) {
    if (!ckpt_h5_exists(f, CKPT_HF_GROUP)) return 0;
    char **names;
    int n;
    if (ckpt_h5_list(f, CKPT_HF_GROUP, &names, &n, err, errlen) != 0) return -1;
    int rc = 0;
    if (n > HF_FILES_MAX) {
        io_set_err(err, errlen, "%s: %s holds %d files, at most %d are kept %s", f->path,
                   CKPT_HF_GROUP, n, HF_FILES_MAX, CKPT_CORRUPT);
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        char path[256], *data;
        uint64_t size, sum;
        snprintf(path, sizeof path, CKPT_HF_GROUP "/%s", names[i]);
        if (!hf_files_known(names[i])) {
            io_set_err(err, errlen, "%s: %s is not a file shardlm keeps %s", f->path, path,
                       CKPT_CORRUPT);
            rc = -1;
            break;
        }
        rc = ckpt_h5_read_bytes(f, path, &data, &size, &sum, err, errlen);
        if (rc == 0 && out) {
            char path_err[512];
            rc = hf_files_add(out, names[i], data, (size_t)size, path_err, sizeof path_err);
            if (rc) io_set_err(err, errlen, "%s: %s", f->path, path_err);
        }
        if (rc == 0 && entries) {
            ckpt_ds_entry *de = &entries[(*n_entries)++];
            snprintf(de->path, sizeof de->path, "%s", path);
            de->ndim = 1;
            de->shape[0] = (int64_t)size;
            de->checksum = sum;
        }
        free(data);
    }
    ckpt_h5_free_names(names, n);
    return rc;
}

/* The datasets of a checkpoint of shape m as the state checksum covers them: path,
 * shape and stored checksum of each, opened through plain links only; the /hf files too
 * (format 3). */
static int read_datasets(ckpt_h5_file *f, const model_shape *m, ckpt_ds_entry **out, int *n,
                         char *err, size_t errlen) {
    ckpt_tensors tl;
    ckpt_tensors_of_shape(&tl, m);
    const int nd = FSDP_STATE_N * tl.n;
    ckpt_ds_entry *e = calloc((size_t)nd + HF_FILES_MAX, sizeof *e);
    SHLM_CHECK_ALLOC(e);
    int rc = 0;
    for (int i = 0; rc == 0 && i < nd; i++) {
        ckpt_h5_dataset d = {.id = -1};
        rc = ckpt_open_dataset(f, &tl, i / tl.n, i % tl.n, &d, &e[i].checksum, err, errlen);
        snprintf(e[i].path, sizeof e[i].path, "%s", d.path);
        e[i].ndim = d.ndim;
        e[i].shape[0] = d.shape[0];
        e[i].shape[1] = d.shape[1];
        ckpt_h5_close_dataset(&d);
    }
    ckpt_tensors_free(&tl);
    int total = nd;
    if (rc == 0) rc = read_hf_group(f, NULL, e, &total, err, errlen);
    if (rc != 0) {
        free(e);
        return -1;
    }
    *out = e;
    *n = total;
    return 0;
}

int checkpoint_read_hf(ckpt_h5_file *f, hf_files *out, char *err, size_t errlen) {
    int n = 0;
    int ok = read_hf_group(f, out, NULL, &n, err, errlen) == 0;
    return ranks_agree(f->comm, ok, err, errlen);
}

int checkpoint_read_hf_path(const char *path, MPI_Comm comm, hf_files *out, char *err,
                            size_t errlen) {
    char what[200];
    snprintf(what, sizeof what, "checkpoint load of %s", ckpt_base_name(path));
    ckpt_guard_begin(what, 0);
    shlm_guard_phase("reading its Hugging Face files");
    ckpt_h5_file f = {.file = -1, .dxpl = -1};
    int ok = checkpoint_open(&f, path, comm, NULL, NULL, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen) == 0) ok = checkpoint_read_hf(&f, out, err, errlen) == 0;
    char ignored[256];
    if (f.file >= 0) ckpt_h5_close(&f, ignored, sizeof ignored);
    shlm_guard_end();
    return ok ? 0 : -1;
}

int checkpoint_open(ckpt_h5_file *f, const char *path, MPI_Comm comm, model_shape *shape,
                    ckpt_state *st, char *err, size_t errlen) {
    if (ckpt_h5_open(f, path, comm, NULL, err, errlen) != 0) return -1;
    char *fmt = NULL;
    int64_t ver = 0;
    if (ckpt_h5_attr_read_str(f, "/", "format", &fmt, err, errlen) != 0 ||
        strcmp(fmt, "shardlm-checkpoint") != 0 ||
        ckpt_h5_attr_read_i64(f, "/", "format_version", &ver, err, errlen) != 0) {
        io_set_err(err, errlen, "%s: not a shardlm checkpoint (no format attribute)", path);
        free(fmt);
        return -1;
    }
    free(fmt);
    if (ver < CKPT_FORMAT_OLDEST || ver > CKPT_FORMAT_VERSION) {
        io_set_err(err, errlen, "%s: checkpoint format version %lld, this shardlm reads %d to %d",
                path, (long long)ver, CKPT_FORMAT_OLDEST, CKPT_FORMAT_VERSION);
        return -1;
    }
    ckpt_record rec;
    if (ckpt_record_read(f, (int)ver, &rec, err, errlen) != 0 ||
        ckpt_record_check(path, &rec, CKPT_CORRUPT, err, errlen) != 0)
        return -1;
    if (ver >= 2) {
        uint64_t stored;
        ckpt_ds_entry *entries;
        int n;
        if (ckpt_h5_attr_read_u64(f, "/", "state_checksum", &stored, err, errlen) != 0 ||
            read_datasets(f, &rec.m, &entries, &n, err, errlen) != 0)
            return -1;
        const uint64_t got = ckpt_state_checksum(&rec, (int)ver, entries, n);
        free(entries);
        if (got != stored) {
            io_set_err(err, errlen, "%s: the state attributes and the datasets' names, shapes and "
                    "checksums give state checksum 0x%016llx, the file says 0x%016llx %s", path,
                    (unsigned long long)got, (unsigned long long)stored, CKPT_CORRUPT);
            return -1;
        }
    }
    rec.st.format_version = (int)ver;
    if (shape) *shape = rec.m;
    if (st) *st = rec.st;
    return 0;
}

int checkpoint_read_state(const char *path, MPI_Comm comm, ckpt_state *st, char *err,
                          size_t errlen) {
    char what[200];
    snprintf(what, sizeof what, "checkpoint load of %s", ckpt_base_name(path));
    ckpt_guard_begin(what, 0);
    shlm_guard_phase("reading its state");
    ckpt_h5_file f = {.file = -1, .dxpl = -1};
    int ok = checkpoint_open(&f, path, comm, NULL, st, err, errlen) == 0;
    char ignored[256];
    if (f.file >= 0) ckpt_h5_close(&f, ignored, sizeof ignored);
    const int rc = ranks_agree(comm, ok, err, errlen);
    shlm_guard_end();
    return rc;
}

/* ---------------------------------------------------------------- load */

/* A load under way: what its steps share. */
typedef struct load_run {
    fsdp_engine *e;
    const topology *topo;
    const char *path;
    MPI_Comm comm;
    ckpt_h5_file f;
    ckpt_tensors tl;
    int nk, nd;         /* state kinds read; their datasets, nk x tl.n */
    uint64_t *sums;     /* (2 nd): this rank's partial sums of its pieces, then all */
    uint64_t *stored;   /* (nd): the checksums the file holds */
    float *buf;         /* one unit's shard */
    uint64_t bytes;
} load_run;

/* Reads dataset i of state kind k into buf, which holds this rank's shard [sb, se) of its
 * unit: the range the shard needs, after checking the dataset's shape and reading its
 * checksum; sums this rank's piece [pb, pe) of it, refusing a value that is not finite.
 * 1, else 0 with err. Local. */
static int load_tensor(load_run *l, int k, int i, size_t sb, size_t se, size_t pb, size_t pe,
                       char *err, size_t errlen) {
    const int di = k * l->tl.n + i;
    const model_tensor *t = l->tl.list[i].t;
    ckpt_h5_dataset d = {.id = -1};
    int ok = ckpt_open_dataset(&l->f, &l->tl, k, i, &d, NULL, err, errlen) == 0;
    if (ok && (d.ndim != t->ndim || d.shape[0] != t->shape[0] ||
               (t->ndim == 2 && d.shape[1] != t->shape[1]))) {
        io_set_err(err, errlen, "%s: dataset %s has shape %s, the model needs %s", l->path,
                   d.path, ckpt_shape_str(d.ndim, d.shape).s, ckpt_shape_str(t->ndim, t->shape).s);
        ok = 0;
    }
    if (ok) ok = ckpt_h5_attr_read_u64(&l->f, d.path, "checksum", &l->stored[di], err, errlen) == 0;
    /* read what the whole shard needs; sum only this rank's piece of it */
    shard_overlap ov, pv;
    shard_intersect(sb, se, t->offset, t->numel, &ov);
    shard_intersect(pb, pe, t->offset, t->numel, &pv);
    if (ok)
        ok = ckpt_h5_read_range(&l->f, &d, ov.tensor_offset, ov.count,
                                l->buf + (ov.count ? ov.flat_offset - sb : 0), err, errlen) == 0;
    if (ok && pv.count) {
        ckpt_h5_sum s = {0, 0};
        const uint64_t bad =
            ckpt_h5_sum_add(&s, l->buf + (pv.flat_offset - sb), pv.tensor_offset, pv.count);
        l->sums[2 * di] = s.s1;
        l->sums[2 * di + 1] = s.s2;
        /* every element is summed, so checked, by exactly one rank */
        if (bad) {
            io_set_err(err, errlen, "%s: dataset %s holds %llu non-finite values (NaN or "
                       "infinite) in elements [%llu, %llu): refusing to load it", l->path,
                       d.path, (unsigned long long)bad, (unsigned long long)pv.tensor_offset,
                       (unsigned long long)(pv.tensor_offset + pv.count));
            ok = 0;
        }
    }
    ckpt_h5_close_dataset(&d);
    l->bytes += t->numel * sizeof(float);
    return ok;
}

/* Unit u of state kind k into the engine: every dataset of it that this rank's shard
 * overlaps (padding stays zero), the ranks agreeing after each. */
static int load_unit(load_run *l, int k, int u, char *err, size_t errlen) {
    size_t sb, se, pb, pe;
    fsdp_shard_range(l->e, u, &sb, &se);
    ckpt_my_piece(l->e, l->topo, u, &pb, &pe);
    memset(l->buf, 0, (se - sb) * sizeof(float));
    for (int i = 0; i < l->tl.n; i++) {
        if (l->tl.list[i].unit != u) continue;
        const int ok = load_tensor(l, k, i, sb, se, pb, pe, err, errlen);
        if (ranks_agree(l->comm, ok, err, errlen)) return -1;
    }
    fsdp_set_state(l->e, u, (fsdp_state_kind)k, l->buf);
    return 0;
}

/* Completes the sums and compares each dataset's with the one it stores; the same verdict
 * on every rank (the sums are global). */
static int load_compare(load_run *l, char *err, size_t errlen) {
    shlm_guard_phase("comparing the checksums");
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, l->sums, 2 * l->nd, MPI_UINT64_T, MPI_SUM, l->comm));
    for (int i = 0; i < l->nd; i++) {
        ckpt_h5_sum s = {l->sums[2 * i], l->sums[2 * i + 1]};
        const uint64_t got = ckpt_h5_sum_final(&s, l->tl.list[i % l->tl.n].t->numel);
        if (got != l->stored[i]) {
            char dpath[256];
            ckpt_dataset_path(&l->tl, i / l->tl.n, i % l->tl.n, dpath, sizeof dpath);
            io_set_err(err, errlen, "%s: dataset %s is corrupt: checksum 0x%016llx, stored "
                       "0x%016llx", l->path, dpath, (unsigned long long)got,
                       (unsigned long long)l->stored[i]);
            return -1;
        }
    }
    return 0;
}

static int load(fsdp_engine *e, const topology *topo, const model_shape *mc,
                const char *path, ckpt_load_what what, ckpt_state *st_out, char *err,
                size_t errlen) {
    const double t0 = MPI_Wtime();
    load_run l = {.e = e, .topo = topo, .path = path, .comm = topo->world,
                  .f = {.file = -1, .dxpl = -1}};
    ckpt_tensors_of_layout(&l.tl, fsdp_layout(e));
    l.nk = what == CKPT_LOAD_ALL ? FSDP_STATE_N : 1;
    l.nd = l.nk * l.tl.n;
    l.sums = calloc((size_t)l.nd * 2, sizeof *l.sums);
    l.stored = calloc((size_t)l.nd, sizeof *l.stored);
    l.buf = malloc(ckpt_max_shard_numel(e) * sizeof(float));
    SHLM_CHECK_ALLOC(l.sums);
    SHLM_CHECK_ALLOC(l.stored);
    SHLM_CHECK_ALLOC(l.buf);
    ckpt_state st;
    model_shape shape;
    int rc = -1;

    shlm_guard_phase("opening the file and checking its state");
    int ok = checkpoint_open(&l.f, path, l.comm, &shape, &st, err, errlen) == 0;
    if (ranks_agree(l.comm, ok, err, errlen)) goto done;
    ok = checkpoint_check_shape(path, &shape, mc, err, errlen) == 0;
    if (ranks_agree(l.comm, ok, err, errlen)) goto done;
    ckpt_fault_load_opened(topo->world_rank);
    shlm_guard_phase("reading the data");
    for (int k = 0; k < l.nk; k++)
        for (int u = 0; u < fsdp_layout(e)->n_units; u++)
            if (load_unit(&l, k, u, err, errlen) != 0) goto done;
    if (load_compare(&l, err, errlen) != 0) goto done;
    const char *io_mode = l.f.io_mode;
    shlm_guard_phase("closing the file");
    ok = ckpt_h5_close(&l.f, err, errlen) == 0;
    if (ranks_agree(l.comm, ok, err, errlen)) goto done;
    if (topo->world_rank == 0) {
        double dt = MPI_Wtime() - t0;
        printf("checkpoint: loaded %s of %s (step %lld, saved by %d ranks %s): %s in %.3f s "
               "= %.2f GB/s, checksums ok%s (%d ranks, %s)\n",
               what == CKPT_LOAD_ALL ? "weights and optimizer" : "weights", path,
               (long long)st.step, st.world_size, st.strategy, ckpt_bytes_str((double)l.bytes).s,
               dt, l.bytes / 1e9 / dt,
               st.format_version < 2 ? ", format 1: the state has no checksum to compare" : "",
               topo->world_size, io_mode);
        fflush(stdout);
    }
    if (st_out) *st_out = st;
    rc = 0;
done:
    if (l.f.file >= 0) {
        char ignored[256];
        ckpt_h5_close(&l.f, ignored, sizeof ignored);
    }
    ckpt_tensors_free(&l.tl);
    free(l.sums);
    free(l.stored);
    free(l.buf);
    return rc;
}

int checkpoint_load(fsdp_engine *e, const topology *topo, const model_shape *mc,
                    const char *path, ckpt_load_what what, ckpt_state *st, char *err,
                    size_t errlen) {
    char text[200];
    snprintf(text, sizeof text, "checkpoint load of %s", ckpt_base_name(path));
    ckpt_guard_begin(text,
                     ckpt_layout_bytes(fsdp_layout(e), what == CKPT_LOAD_ALL ? FSDP_STATE_N : 1));
    const int rc = load(e, topo, mc, path, what, st, err, errlen);
    shlm_guard_end();
    return rc;
}
