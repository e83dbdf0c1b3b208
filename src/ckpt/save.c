/* The save protocol (checkpoint.h): a temporary name, the metadata, every rank's pieces of
 * the data, the checksums and the state, then the commit under the final name and
 * `latest`; a failure anywhere removes the temporary file and touches nothing else. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "io/errmsg.h"
#include "io/safe_file.h"
#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "src/base/agree.h"
#include "src/base/shard.h"
#include "src/ckpt/ckpt_internal.h"
#include "src/ckpt/tensors.h"

/* How a save moves its data: the job's [checkpoint] direct_io, collective_io, alignment
 * (datasets of at least `alignment` bytes start at a multiple of it). */
static void save_options(const job_config *cfg, ckpt_h5_options *opt) {
    ckpt_h5_default_options(opt);
    opt->direct_io = cfg->ckpt_direct_io;
    opt->collective_io = cfg->ckpt_collective_io;
    opt->alignment = (uint64_t)cfg->ckpt_alignment;
    opt->align_threshold = opt->alignment;
}

/* The bytes of the files kept for export. */
static uint64_t hf_bytes(const hf_files *hf) {
    uint64_t b = 0;
    for (int i = 0; hf && i < hf->n; i++) b += hf->f[i].size;
    return b;
}

/* An upper bound of the file's size: data, alignment gaps, metadata, the kept files. */
static uint64_t estimate_file_bytes(const ckpt_tensors *tl, const ckpt_h5_options *opt,
                                    size_t job_len, const hf_files *hf) {
    /* metadata comes in blocks of 1 MiB (make_fapl): ~2 KiB per dataset (object header,
     * checksum, group links) and the root attributes, rounded up, plus a spare block */
    const uint64_t mib = 1u << 20;
    uint64_t meta = 64 * 1024 + 2 * job_len + (uint64_t)FSDP_STATE_N * tl->n * 2048;
    uint64_t b = (meta + mib - 1) / mib * mib + mib + hf_bytes(hf);
    for (int k = 0; k < FSDP_STATE_N; k++) {
        for (int i = 0; i < tl->n; i++) {
            uint64_t n = tl->list[i].t->numel * sizeof(float);
            b += n;
            if (opt->alignment > 1 && n >= opt->align_threshold) b += opt->alignment;
        }
    }
    return b;
}

uint64_t ckpt_save_bytes(fsdp_engine *e, const job_config *cfg, const hf_files *hf) {
    ckpt_tensors tl;
    ckpt_tensors_of_layout(&tl, fsdp_layout(e));
    ckpt_h5_options opt;
    save_options(cfg, &opt);
    const uint64_t b = estimate_file_bytes(&tl, &opt, cfg->text ? strlen(cfg->text) : 0, hf);
    ckpt_tensors_free(&tl);
    return b;
}

/* ---------------------------------------------------------------- one save */

/* A save under way: what its steps share. */
typedef struct save_run {
    fsdp_engine *e;
    const topology *topo;
    const job_config *cfg;
    const ckpt_state *st;
    const hf_files *hf;
    const char *dir;
    const ckpt_staging *staged;  /* the data copied out at the step, or NULL: the engine's */
    MPI_Comm comm;               /* the world, or the writer threads' duplicate of it */
    int rank;
    char name[64], final[1100];  /* step_<N>.h5; <dir>/step_<N>.h5 */
    char tmp[1200];              /* the file written, renamed to final by the commit */
    ckpt_record rec;             /* the state as it will be read back */
    ckpt_tensors tl;
    int nd;                      /* datasets of the engine's state: FSDP_STATE_N x tl.n */
    int n_hf;                    /* kept files */
    ckpt_h5_options opt;
    ckpt_h5_file f;
    ckpt_h5_dataset *ds;         /* (nd), in checkpoint_groups order, then the list's */
    uint64_t *sums;              /* (2 nd): this rank's partial sums of its pieces, then all */
    float *buf;                  /* one unit's shard, read from the engine (staged == NULL) */
    const float *shard;          /* the shard being written: buf or a staged one */
    int created;                 /* tmp is this save's file */
    int close_failed;            /* HDF5 could not close it */
    uint64_t bytes;
    double t0, t_data, t_close, t_commit;
    double prof[4];              /* this rank's data phase: copy, write, checksum, wait */
} save_run;

static void save_init(save_run *s, fsdp_engine *e, const topology *topo, const job_config *cfg,
                      const ckpt_state *st, const hf_files *hf, const char *dir,
                      MPI_Comm comm, const ckpt_staging *staged) {
    memset(s, 0, sizeof *s);
    s->e = e, s->topo = topo, s->cfg = cfg, s->st = st, s->hf = hf, s->dir = dir;
    s->staged = staged;
    s->comm = comm;
    s->rank = topo->world_rank;
    s->t0 = MPI_Wtime();
    snprintf(s->name, sizeof s->name, "step_%lld.h5", (long long)st->step);
    snprintf(s->final, sizeof s->final, "%s/%s", dir, s->name);
    s->f = (ckpt_h5_file){.file = -1, .dxpl = -1};
    s->n_hf = hf ? hf->n : 0;
}

/* What the rest of the save needs, once the name is agreed: the dataset list, the
 * buffers, the options, the record. */
static void save_alloc(save_run *s) {
    ckpt_tensors_of_layout(&s->tl, fsdp_layout(s->e));
    s->nd = FSDP_STATE_N * s->tl.n;
    s->ds = calloc((size_t)s->nd, sizeof *s->ds);
    s->sums = calloc((size_t)s->nd * 2, sizeof *s->sums);
    if (!s->staged) {
        s->buf = malloc(ckpt_max_shard_numel(s->e) * sizeof(float));
        SHLM_CHECK_ALLOC(s->buf);
    }
    SHLM_CHECK_ALLOC(s->ds);
    SHLM_CHECK_ALLOC(s->sums);
    for (int i = 0; i < s->nd; i++) s->ds[i].id = -1;
    save_options(s->cfg, &s->opt);
    s->rec = (ckpt_record){.st = *s->st, .m = s->cfg->model};
    snprintf(s->rec.st.strategy, sizeof s->rec.st.strategy, "%s",
             strategy_name(s->topo->strategy));
    s->rec.st.world_size = s->topo->world_size;
    s->rec.st.shard_size = s->topo->shard_size;
    s->rec.st.replica_size = s->topo->replica_size;
}

static void save_free(save_run *s) {
    ckpt_tensors_free(&s->tl);
    free(s->ds);
    free(s->sums);
    free(s->buf);
}

/* The path of kept file i in the checkpoint. */
static void hf_path(const save_run *s, int i, char *path, size_t pathlen) {
    snprintf(path, pathlen, CKPT_HF_GROUP "/%s", s->hf->f[i].name);
}

/* Rank 0 picks an unpredictable temporary name, which all ranks then create exclusively
 * (a planted link at a guessable name would be written through). */
static int save_name(save_run *s, char *err, size_t errlen) {
    shlm_guard_phase("choosing the file name");
    int ok = s->rank != 0 ||
             (safe_file_mkdir_p(s->dir, err, errlen) == 0 &&
              safe_file_refuse_link(s->final, err, errlen) == 0 &&
              safe_file_temp_name(s->final, s->tmp, sizeof s->tmp, err, errlen) == 0);
    if (ranks_agree(s->comm, ok, err, errlen)) return -1;
    MPI_CHECK(MPI_Bcast(s->tmp, (int)sizeof s->tmp, MPI_CHAR, 0, s->comm));
    return 0;
}

/* The state as it will be read back (a file no load would accept is not written), and
 * whether the file fits. */
static int save_check(save_run *s, char *err, size_t errlen) {
    shlm_guard_phase("checking the state and the free space");
    int ok = ckpt_record_check(s->final, &s->rec,
                               "(refusing to write a checkpoint no load would accept)", err,
                               errlen) == 0;
    if (ranks_agree(s->comm, ok, err, errlen)) return -1;
    const uint64_t need =
        estimate_file_bytes(&s->tl, &s->opt, s->cfg->text ? strlen(s->cfg->text) : 0, s->hf);
    ok = ckpt_dir_check_space(s->dir, s->rank, need, err, errlen) == 0;
    return ranks_agree(s->comm, ok, err, errlen);
}

static int save_create(save_run *s, char *err, size_t errlen) {
    shlm_guard_phase("creating the file");
    const int ok = ckpt_h5_create(&s->f, s->tmp, s->comm, &s->opt, err, errlen) == 0;
    if (ranks_agree(s->comm, ok, err, errlen)) return -1;
    s->created = 1;
    ckpt_fault_save_created(s->rank, s->st->step);
    return 0;
}

/* All metadata first, flushed, so that a failing data write leaves a file that closes
 * cleanly (ckpt_h5_flush); checksum attributes start at 0 and are set at the end. */
static int save_metadata(save_run *s, char *err, size_t errlen) {
    shlm_guard_phase("writing the metadata");
    int ok = 1;
    for (int k = 0; ok && k < FSDP_STATE_N; k++)
        ok = ckpt_h5_create_group(&s->f, checkpoint_groups[k], err, errlen) == 0;
    for (int i = 0; ok && i < s->nd; i++) {
        const model_tensor *t = s->tl.list[i % s->tl.n].t;
        char path[256];
        ckpt_dataset_path(&s->tl, i / s->tl.n, i % s->tl.n, path, sizeof path);
        ok = ckpt_h5_create_dataset(&s->f, path, t->ndim, t->shape, &s->ds[i], err, errlen) == 0 &&
             ckpt_h5_attr_write_u64(&s->f, path, "checksum", 0, err, errlen) == 0;
        s->bytes += t->numel * sizeof(float);
    }
    /* the kept files: created, with their checksums, here; written with the data */
    if (ok && s->n_hf) ok = ckpt_h5_create_group(&s->f, CKPT_HF_GROUP, err, errlen) == 0;
    for (int i = 0; ok && i < s->n_hf; i++) {
        char path[256];
        hf_path(s, i, path, sizeof path);
        ok = ckpt_h5_create_bytes(&s->f, path, s->hf->f[i].data, s->hf->f[i].size, err,
                                  errlen) == 0;
        s->bytes += s->hf->f[i].size;
    }
    if (ok) ok = ckpt_root_attrs_write(&s->f, &s->rec, s->cfg, err, errlen) == 0;
    if (ok) ok = ckpt_h5_flush(&s->f, err, errlen) == 0;
    return ranks_agree(s->comm, ok, err, errlen);
}

/* Writes this rank's piece [pb, pe) of tensor i of state kind k from shard, which holds its
 * shard of the tensor's unit from element sb on, and sums it. *ok goes 0 at the first
 * failure (err says it); the rank then still joins the (collective) writes, writing
 * nothing. */
static void write_piece(save_run *s, int k, int i, size_t sb, size_t pb, size_t pe, int *ok,
                        char *err, size_t errlen) {
    const int di = k * s->tl.n + i;
    const model_tensor *t = s->tl.list[i].t;
    shard_overlap ov;
    shard_intersect(pb, pe, t->offset, t->numel, &ov);
    const float *src = s->shard + (ov.count ? ov.flat_offset - sb : 0);
    const double tw = MPI_Wtime();
    if (ckpt_h5_write_range(&s->f, &s->ds[di], ov.tensor_offset, *ok ? ov.count : 0, src, err,
                            errlen) != 0)
        *ok = 0;
    const double ts = MPI_Wtime();
    ckpt_h5_sum sum = {0, 0};
    const uint64_t bad = ckpt_h5_sum_add(&sum, src, ov.tensor_offset, ov.count);
    s->sums[2 * di] = sum.s1;
    s->sums[2 * di + 1] = sum.s2;
    /* `latest` never names a checkpoint with a NaN or an infinity in it */
    if (bad && *ok)
        io_set_err(err, errlen, "%s: %llu of the %llu elements rank %d writes are not finite "
                   "(NaN or infinite): refusing to save them", s->ds[di].path,
                   (unsigned long long)bad, (unsigned long long)ov.count, s->rank);
    if (bad) *ok = 0;
    s->prof[1] += ts - tw;
    s->prof[2] += MPI_Wtime() - ts;
}

/* The data: per state kind and unit, this rank's shard once from the engine (or as staged
 * at the step), then its piece of every tensor the shard overlaps; then the kept files. Ranks do not wait for
 * each other between datasets (they agree once, after the last): a rank whose write
 * failed keeps joining the calls with nothing to write, as H5Dwrite is collective. */
static int save_data(save_run *s, char *err, size_t errlen) {
    s->t_data = MPI_Wtime();
    shlm_guard_phase("writing the data");
    const model_layout *lay = fsdp_layout(s->e);
    int ok = 1, done = 0;
    for (int k = 0; k < FSDP_STATE_N; k++) {
        for (int u = 0; u < lay->n_units; u++) {
            size_t sb, se, pb, pe;
            fsdp_shard_range(s->e, u, &sb, &se);
            ckpt_my_piece(s->e, s->topo, u, &pb, &pe);
            const double tc = MPI_Wtime();
            if (s->staged) {
                s->shard = s->staged->shard[k * lay->n_units + u];
            } else {
                fsdp_get_state(s->e, u, (fsdp_state_kind)k, s->buf);
                s->shard = s->buf;
            }
            s->prof[0] += MPI_Wtime() - tc;
            for (int i = 0; i < s->tl.n; i++) {
                if (s->tl.list[i].unit != u) continue;
                write_piece(s, k, i, sb, pb, pe, &ok, err, errlen);
                ckpt_fault_save_write_error(s->rank, s->st->step, done + 1, s->nd, s->tmp, &ok,
                                            err, errlen);
                ckpt_fault_save_dataset_written(s->rank, s->st->step, ++done, s->nd, s->tmp);
            }
        }
    }
    ckpt_fault_save_data_written(s->rank, s->st->step);
    for (int i = 0; i < s->n_hf; i++) { /* a failed rank still joins the calls (collective) */
        char path[256];
        hf_path(s, i, path, sizeof path);
        if (ckpt_h5_write_bytes(&s->f, path, s->hf->f[i].data, s->hf->f[i].size, err,
                                errlen) != 0)
            ok = 0;
    }
    const double tw = MPI_Wtime();
    if (ranks_agree(s->comm, ok, err, errlen)) return -1;
    s->prof[3] += MPI_Wtime() - tw;
    return 0;
}

/* Completes the checksums (every element was summed by exactly one rank), writes them,
 * and the state checksum over the record and every dataset. */
static int save_checksums(save_run *s, char *err, size_t errlen) {
    shlm_guard_phase("completing the checksums");
    const int nd = s->nd;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, s->sums, 2 * nd, MPI_UINT64_T, MPI_SUM, s->comm));
    ckpt_ds_entry *entries = calloc((size_t)(nd + s->n_hf), sizeof *entries);
    SHLM_CHECK_ALLOC(entries);
    for (int i = 0; i < s->n_hf; i++) {
        ckpt_ds_entry *de = &entries[nd + i];
        hf_path(s, i, de->path, sizeof de->path);
        de->ndim = 1;
        de->shape[0] = (int64_t)s->hf->f[i].size;
        de->checksum = ckpt_h5_bytes_checksum(s->hf->f[i].data, s->hf->f[i].size);
    }
    int ok = 1;
    for (int i = 0; ok && i < nd; i++) {
        ckpt_h5_sum sum = {s->sums[2 * i], s->sums[2 * i + 1]};
        const ckpt_h5_dataset *d = &s->ds[i];
        ckpt_ds_entry *de = &entries[i];
        snprintf(de->path, sizeof de->path, "%s", d->path);
        de->ndim = d->ndim;
        de->shape[0] = d->shape[0];
        de->shape[1] = d->shape[1];
        de->checksum = ckpt_h5_sum_final(&sum, d->numel);
        ok = ckpt_h5_attr_write_u64(&s->f, d->path, "checksum", de->checksum, err, errlen) == 0;
    }
    if (ok)
        ok = ckpt_h5_attr_write_u64(&s->f, "/", "state_checksum",
                                    ckpt_state_checksum(&s->rec, CKPT_FORMAT_VERSION, entries,
                                                        nd + s->n_hf),
                                    err, errlen) == 0;
    free(entries);
    return ranks_agree(s->comm, ok, err, errlen);
}

/* Creates the file and writes all of it. On failure the file is closed again (its
 * datasets first), every rank agreeing on whether HDF5 could. */
static int save_write(save_run *s, char *err, size_t errlen) {
    if (save_create(s, err, errlen) == 0 && save_metadata(s, err, errlen) == 0 &&
        save_data(s, err, errlen) == 0 && save_checksums(s, err, errlen) == 0)
        return 0;
    shlm_guard_phase("removing the failed file");
    for (int i = 0; i < s->nd; i++) ckpt_h5_close_dataset(&s->ds[i]);
    if (s->f.file >= 0) {
        char why[512];
        s->close_failed = ranks_agree(s->comm, ckpt_h5_close(&s->f, why, sizeof why) == 0, why,
                                      sizeof why) != 0;
    }
    return -1;
}

static int save_close(save_run *s, char *err, size_t errlen) {
    s->t_close = MPI_Wtime();
    shlm_guard_phase("closing the file");
    for (int i = 0; i < s->nd; i++) ckpt_h5_close_dataset(&s->ds[i]);
    const int ok = ckpt_h5_close(&s->f, err, errlen) == 0;
    if (ranks_agree(s->comm, ok, err, errlen) == 0) return 0;
    s->close_failed = 1;
    return -1;
}

/* Only now does the checkpoint exist under its name and in `latest`. */
static int save_commit(save_run *s, char *err, size_t errlen) {
    s->t_commit = MPI_Wtime();
    shlm_guard_phase("committing it (fsync, rename, latest)");
    const int ok =
        s->rank != 0 || ckpt_dir_commit(s->dir, s->tmp, s->final, s->name, err, errlen) == 0;
    return ranks_agree(s->comm, ok, err, errlen);
}

/* Rank 0: the line with the size, the time and its phases; then the directory pruned. */
static void save_report(const save_run *s, int keep) {
    const double t1 = MPI_Wtime();
    if (s->rank != 0) return;
    const double *prof = s->prof;
    printf("checkpoint: saved step %lld to %s%s: %s in %.3f s = %.2f GB/s (create %.3f s, "
           "data %.3f s [rank 0: copy %.3f, write %.3f, checksum %.3f, wait %.3f], close %.3f s, "
           "fsync+rename %.3f s; %d ranks, %s)\n",
           (long long)s->st->step, s->final, s->staged ? " in the background" : "", ckpt_bytes_str((double)s->bytes).s, t1 - s->t0,
           s->bytes / 1e9 / (t1 - s->t0), s->t_data - s->t0, s->t_close - s->t_data, prof[0],
           prof[1], prof[2], prof[3], s->t_commit - s->t_close, t1 - s->t_commit,
           s->topo->world_size, s->f.io_mode);
    ckpt_dir_prune(s->dir, keep, s->st->step);
    fflush(stdout);
}

/* A failed save, its file closed: the file removed, and one message saying that nothing
 * earlier was touched and how full the disk is. */
static void save_undo(save_run *s, char *err, size_t errlen) {
    MPI_CHECK(MPI_Barrier(s->comm));
    if (s->rank == 0 && s->created) unlink(s->tmp);
    /* MPI-IO reports a full disk as a short write: say how full the disk is */
    char why[1536], space[96] = "";
    snprintf(why, sizeof why, "%s", err);
    struct statvfs sv;
    if (statvfs(s->dir, &sv) == 0)
        snprintf(space, sizeof space, " [%s free there]",
                 ckpt_bytes_str((double)sv.f_bavail * sv.f_frsize).s);
    io_set_err(err, errlen, "checkpoint save of step %lld failed (earlier checkpoints and "
               "%s/latest untouched): %s%s", (long long)s->st->step, s->dir, why, space);
    /* HDF5 1.10 cannot shut down after a failed close of a file being written (its ID
     * dangles and MPI_Finalize would crash in H5F__close_cb): end the job here, with
     * the message, instead of returning to a clean exit that cannot happen */
    if (s->close_failed)
        SHLM_FATAL("%s; HDF5 could not close the file, so the job ends here", err);
}

/* The protocol, each step agreed by every rank before the next. */
static int save(fsdp_engine *e, const topology *topo, const job_config *cfg,
                const ckpt_state *st, const hf_files *hf, const char *dir, int keep,
                MPI_Comm comm, const ckpt_staging *staged, char *err, size_t errlen) {
    /* a full disk or a file-size limit must fail the write (EFBIG), not kill the rank */
    signal(SIGXFSZ, SIG_IGN);
    save_run s;
    save_init(&s, e, topo, cfg, st, hf, dir, comm, staged);
    if (save_name(&s, err, errlen) != 0) return -1; /* nothing written yet */
    save_alloc(&s);
    int rc = save_check(&s, err, errlen);
    if (rc == 0) rc = save_write(&s, err, errlen);
    if (rc == 0) rc = save_close(&s, err, errlen);
    if (rc == 0) rc = save_commit(&s, err, errlen);
    if (rc == 0) save_report(&s, keep);
    else save_undo(&s, err, errlen);
    save_free(&s);
    return rc;
}

int ckpt_save_over(fsdp_engine *e, const topology *topo, const job_config *cfg,
                   const ckpt_state *st, const hf_files *hf, const char *dir, int keep,
                   MPI_Comm comm, const ckpt_staging *staged, char *err, size_t errlen) {
    char what[80];
    snprintf(what, sizeof what, "checkpoint save of step %lld%s", (long long)st->step,
             staged ? " (background)" : "");
    ckpt_guard_begin(what, ckpt_save_bytes(e, cfg, hf));
    const int rc = save(e, topo, cfg, st, hf, dir, keep, comm, staged, err, errlen);
    shlm_guard_end();
    return rc;
}

int checkpoint_save(fsdp_engine *e, const topology *topo, const job_config *cfg,
                    const ckpt_state *st, const hf_files *hf, const char *dir, int keep,
                    char *err, size_t errlen) {
    return ckpt_save_over(e, topo, cfg, st, hf, dir, keep, topo->world, NULL, err, errlen);
}
