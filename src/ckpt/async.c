/* Checkpoints written in the background (checkpoint.async, checkpoint.h): the step's state
 * copied into host staging buffers, then the save protocol of save.c run by a writer
 * thread over a duplicate of the world while the main thread trains on. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "src/base/agree.h"
#include "kernels/ops.h"
#include "src/ckpt/ckpt_internal.h"

struct ckpt_async {
    const shlm_ops *ops;      /* host_alloc/host_free of the staging where it has them */
    fsdp_engine *e;
    const topology *topo;
    const job_config *cfg;
    const hf_files *hf;
    /* The writer threads' duplicate of the world. Parallel HDF5 calls MPI-IO collectives
     * (MPI_File_open, barriers, collective metadata writes) from the writer while the main
     * thread runs the step's collectives: legal under MPI_THREAD_MULTIPLE only, and only
     * on a communicator no other thread uses at the same time, which a duplicate is (the
     * main thread never touches it; the watchdog's roll calls have their own). */
    MPI_Comm comm;
    ckpt_staging stage;
    uint64_t stage_bytes;
    pthread_t thread;
    int in_flight;            /* a writer started and not yet joined */
    pthread_mutex_t mu;
    int finished;             /* under mu: the writer has returned */
    ckpt_state st;            /* the state of the save in flight */
    int rc;                   /* its outcome, the same on every rank (the protocol agrees) */
    char err[1536];
};

int checkpoint_async_used(const job_config *cfg, int first, int end) {
    if (!cfg->ckpt_async || !cfg->ckpt_dir[0] || cfg->ckpt_every <= 0) return 0;
    const long long next = ((long long)first / cfg->ckpt_every + 1) * cfg->ckpt_every;
    return next < end;
}

uint64_t checkpoint_async_staging_bytes(fsdp_engine *e) {
    const model_layout *lay = fsdp_layout(e);
    uint64_t n = 0;
    for (int u = 0; u < lay->n_units; u++) {
        size_t b, end;
        fsdp_shard_range(e, u, &b, &end);
        n += end - b;
    }
    return (uint64_t)FSDP_STATE_N * n * sizeof(float);
}

static void stage_free(const shlm_ops *ops, ckpt_staging *st) {
    for (int i = 0; st->shard && i < FSDP_STATE_N * st->n_units; i++) {
        if (ops->host_free) ops->host_free(st->shard[i]);
        else free(st->shard[i]);
    }
    free(st->shard);
    st->shard = NULL;
}

/* The staging buffers, one per state kind and unit (page-locked where the backend has
 * them: the device copies into them at full speed); 0, or -1 where the host refuses them
 * (nothing kept). */
static int stage_alloc(ckpt_async *a) {
    const model_layout *lay = fsdp_layout(a->e);
    ckpt_staging *st = &a->stage;
    st->n_units = lay->n_units;
    st->shard = calloc((size_t)FSDP_STATE_N * lay->n_units, sizeof *st->shard);
    if (!st->shard) return -1;
    for (int k = 0; k < FSDP_STATE_N; k++) {
        for (int u = 0; u < lay->n_units; u++) {
            size_t b, end;
            fsdp_shard_range(a->e, u, &b, &end);
            /* written now, so that the pages exist before the first save's copy, which
             * would otherwise fault them in during a step */
            const size_t bytes = (end - b > 0 ? end - b : 1) * sizeof(float);
            float *p = a->ops->host_alloc ? a->ops->host_alloc(bytes) : malloc(bytes);
            if (!p) {
                stage_free(a->ops, st);
                return -1;
            }
            memset(p, 0, bytes);
            st->shard[k * lay->n_units + u] = p;
        }
    }
    return 0;
}

int checkpoint_async_open(ckpt_async **out, const shlm_ops *ops, fsdp_engine *e,
                          const topology *topo, const job_config *cfg, const hf_files *hf,
                          double host_avail, const char *avail_what) {
    *out = NULL;
    ckpt_async *a = calloc(1, sizeof *a);
    SHLM_CHECK_ALLOC(a);
    a->ops = ops, a->e = e, a->topo = topo, a->cfg = cfg, a->hf = hf;
    a->stage_bytes = checkpoint_async_staging_bytes(e);
    int level = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&level));
    char why[512] = "";
    if (level != MPI_THREAD_MULTIPLE)
        snprintf(why, sizeof why, "this MPI library gives no MPI_THREAD_MULTIPLE, which a "
                 "writer thread's parallel HDF5 beside the training's collectives needs");
    else if (host_avail >= 0 && (double)a->stage_bytes > host_avail)
        snprintf(why, sizeof why, "its staging needs %s per rank, more than %s",
                 ckpt_bytes_str((double)a->stage_bytes).s, avail_what);
    else if (stage_alloc(a) != 0)
        snprintf(why, sizeof why, "the host refused %s of staging memory on rank %d",
                 ckpt_bytes_str((double)a->stage_bytes).s, topo->world_rank);
    char err[1536];
    snprintf(err, sizeof err, "%s", why);
    if (ranks_agree(topo->world, why[0] == '\0', err, sizeof err) != 0) {
        if (topo->world_rank == 0) {
            printf("checkpoint: checkpoint.async = true, but %s: saving synchronously\n", err);
            fflush(stdout);
        }
        stage_free(ops, &a->stage);
        free(a);
        return -1;
    }
    MPI_CHECK(MPI_Comm_dup(topo->world, &a->comm));
    pthread_mutex_init(&a->mu, NULL);
    if (topo->world_rank == 0) {
        printf("checkpoint: saved in the background: %s of host staging per rank (%llu bytes; "
               "%s)\n", ckpt_bytes_str((double)a->stage_bytes).s,
               (unsigned long long)a->stage_bytes, avail_what);
        fflush(stdout);
    }
    *out = a;
    return 0;
}

/* How much lower the writer's CPU priority is than the training's: where the cores are
 * all busy (OpenMP threads on every one) its checksums and HDF5 work take what the
 * training leaves instead of slowing the steps it overlaps (benchmarks/bench_ckpt_async.sh);
 * its I/O does not wait on the CPU. */
#define WRITER_NICE 10

static void *writer_main(void *arg) {
    ckpt_async *a = arg;
    /* Linux: a thread's nice value is its own (the guard thread it starts inherits it); a
     * refused change leaves the writer at the training's priority, which is only slower */
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), WRITER_NICE);
    const int rc = ckpt_save_over(a->e, a->topo, a->cfg, &a->st, a->hf, a->cfg->ckpt_dir,
                                  a->cfg->ckpt_keep, a->comm, &a->stage, a->err,
                                  sizeof a->err);
    pthread_mutex_lock(&a->mu);
    a->rc = rc;
    a->finished = 1;
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* Joins the writer in flight (local); its outcome. */
static int join(ckpt_async *a, char *err, size_t errlen) {
    if (!a->in_flight) return 0;
    pthread_join(a->thread, NULL);
    a->in_flight = 0;
    if (a->rc != 0) snprintf(err, errlen, "%s", a->err);
    return a->rc;
}

int checkpoint_async_save(ckpt_async *a, const ckpt_state *st, char *err, size_t errlen) {
    if (a->in_flight) {
        pthread_mutex_lock(&a->mu);
        const int finished = a->finished;
        pthread_mutex_unlock(&a->mu);
        const double t0 = MPI_Wtime();
        if (join(a, err, errlen) != 0) return -1;
        if (!finished && a->topo->world_rank == 0) {
            printf("checkpoint: step %lld waited %.3f s for the save of step %lld in flight "
                   "(one save at a time)\n", (long long)st->step, MPI_Wtime() - t0,
                   (long long)a->st.step);
            fflush(stdout);
        }
    }
    /* the copy: the step's state as it is now, landed before the next step can change it
     * (on a device: queued on a side stream, the backend's stream not drained for it) */
    const model_layout *lay = fsdp_layout(a->e);
    for (int k = 0; k < FSDP_STATE_N; k++)
        for (int u = 0; u < lay->n_units; u++)
            fsdp_get_state_async(a->e, u, (fsdp_state_kind)k,
                                 a->stage.shard[k * lay->n_units + u]);
    fsdp_get_state_wait(a->e);
    a->st = *st;
    a->finished = 0;
    a->rc = 0;
    a->err[0] = '\0';
    /* stop signals stay the main thread's (src/base/signals.h): the writer, and the
     * watchdog's guard thread it starts, inherit them blocked */
    sigset_t block, old;
    sigemptyset(&block);
    const int async_sig[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP, SIGPIPE, SIGALRM,
                             SIGCHLD};
    for (size_t i = 0; i < sizeof async_sig / sizeof async_sig[0]; i++)
        sigaddset(&block, async_sig[i]);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    const int started = pthread_create(&a->thread, NULL, writer_main, a) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!started)
        SHLM_FATAL("no thread for the background save of step %lld", (long long)st->step);
    a->in_flight = 1;
    return 0;
}

int checkpoint_async_poll(ckpt_async *a, char *err, size_t errlen) {
    if (!a || !a->in_flight) return 0;
    pthread_mutex_lock(&a->mu);
    int all = a->finished;
    pthread_mutex_unlock(&a->mu);
    MPI_CHECK(shlm_timed_allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, a->topo->world));
    return all ? join(a, err, errlen) : 0;
}

int checkpoint_async_wait(ckpt_async *a, char *err, size_t errlen) {
    return a ? join(a, err, errlen) : 0;
}

int checkpoint_async_in_flight(const ckpt_async *a) { return a && a->in_flight; }

void checkpoint_async_close(ckpt_async *a) {
    if (!a) return;
    char err[1536];
    (void)join(a, err, sizeof err);
    stage_free(a->ops, &a->stage);
    MPI_CHECK(MPI_Comm_free(&a->comm));
    pthread_mutex_destroy(&a->mu);
    free(a);
}
