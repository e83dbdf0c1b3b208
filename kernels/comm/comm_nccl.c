/* The NCCL comm backend: each MPI group twinned with an NCCL communicator, collectives
 * on a per-group stream ordered against the cuda backend's stream with events, and a
 * watchdog that turns an NCCL error or a stuck collective into a clear abort. */
#ifdef HAVE_CONFIG_H
#include "shlm_config.h"
#endif

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include "kernels/check.h"
#include "kernels/comm.h"
#include "kernels/comm/comm_watchdog.h"
#include "kernels/cuda/cuda.h"

/* Evaluates call (of type T, text `text`) once; a result other than ok is fatal, named
 * by str(result). A macro: the call's text and the caller's file:line go into the line. */
#define STATUS_CHECK_(T, ok, str, call, text)                                             \
    do {                                                                                  \
        T status_check_rc_ = (call);                                                      \
        if (status_check_rc_ != (ok))                                                     \
            SHLM_FATAL("%s failed: %s", text, str(status_check_rc_));                     \
    } while (0)
#define NCCL_CHECK(call) STATUS_CHECK_(ncclResult_t, ncclSuccess, ncclGetErrorString, call, #call)
#define CUDART_CHECK(call) STATUS_CHECK_(cudaError_t, cudaSuccess, cudaGetErrorString, call, #call)

/* A buffer registered as a symmetric window of the copy-engine communicator: an
 * all-gather receive buffer. */
typedef struct gather_window {
    void *ptr;
    size_t bytes;
#if defined(NCCL_CTA_POLICY_ZERO)
    ncclWindow_t win;
#endif
    struct gather_window *next;
} gather_window;

struct shlm_comm_group {
    MPI_Comm mpi;
    ncclComm_t nccl;        /* NULL on a group of one rank: its collectives are local copies */
    ncclComm_t nccl_ce;     /* zero-CTA policy: collectives between registered windows */
    gather_window *windows; /* all-gather receive buffers */
    int rank, size;
    cudaStream_t stream; /* this group's collectives run here, in issue order */
    shlm_comm_stats stats;
    long delay_us;       /* -1: follow the backend-wide delay */
    char label[160];     /* "shard group (ranks 0-3)", for the watchdog's messages */
};

/* One collective in flight, watched until its completion event fires: the request
 * handed to the caller points at it; wait() detaches the request but the entry stays
 * until the GPU is done, so a stuck collective is caught even after wait(). */
typedef struct watch {
    cudaEvent_t done;
    shlm_watch sw;       /* number, issue time, deadline (runtime.comm_timeout_s) */
    shlm_comm_op op;
    shlm_comm_group *g;
    int detached;        /* wait() was called */
    struct watch *next;
} watch;

struct shlm_comm_req {
    watch *w;
};

/* Compute-stream stall spans (events around a stream wait), read back by stats(). */
typedef struct stall {
    cudaEvent_t begin, end;
    shlm_comm_group *g;
    struct stall *next;
} stall;

static watch *g_watch;
static stall *g_stalls;
static long g_delay_us;
/* the job's [nccl] keys, from init(); copy-engine all-gathers are on by default */
static shlm_comm_options g_opt = {.nccl_copy_engine_allgather = 1};

static void nccl_init(const shlm_comm_options *o) { g_opt = *o; }

static cudaStream_t compute_stream(void) { return (cudaStream_t)shlm_cuda_stream_handle(); }

static ncclDataType_t nccl_type(shlm_dtype dt) { return dt == SHLM_BF16 ? ncclBfloat16 : ncclFloat32; }
static ncclRedOp_t nccl_op(shlm_comm_redop op) { return op == SHLM_COMM_AVG ? ncclAvg : ncclSum; }

static int nccl_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static int nccl_progress(void);

/* the cuda backend's host waits run the watchdog: a compute stream stuck behind a
 * collective must not hang the host where progress() is never called */
static void progress_while_host_waits(void) { nccl_progress(); }

static shlm_comm_group *nccl_group_create(MPI_Comm comm) {
    shlm_comm_group *g = calloc(1, sizeof *g);
    SHLM_CHECK_ALLOC(g);
    MPI_CHECK(MPI_Comm_dup(comm, &g->mpi));
    MPI_CHECK(MPI_Comm_rank(g->mpi, &g->rank));
    MPI_CHECK(MPI_Comm_size(g->mpi, &g->size));
    shlm_comm_describe(comm, g->label, sizeof g->label);
    CUDART_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    g->delay_us = -1;
    shlm_cuda_set_host_wait_hook(progress_while_host_waits);
    /* A group of one rank gets no communicator: every collective on it is the identity
     * (a copy when send and receive differ), and an NCCL communicator costs 0.4-0.6 GB
     * of device memory (its channels' buffers) even for one rank. */
    if (g->size == 1) return g;
    ncclUniqueId id;
    if (g->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, g->mpi));
    /* nccl.cta_policy = efficiency: NCCL's kernels (the reduce-scatters) use as few SMs as
     * keep them decent, leaving more to the matmuls they overlap (NCCL 2.27 and later;
     * older NCCL keeps its default) */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
#if defined(NCCL_CTA_POLICY_EFFICIENCY)
    if (g_opt.nccl_cta_policy == SHLM_NCCL_CTA_EFFICIENCY) cfg.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
#endif
    NCCL_CHECK(ncclCommInitRankConfig(&g->nccl, g->size, id, g->rank, &cfg));
    return g;
}

/* ---- copy-engine collectives ----
 * NCCL (2.28 and later) moves an all-gather or all-to-all with the GPUs' copy engines
 * instead of SM kernels when the communicator's CTA policy is "zero" and the buffers are
 * symmetric windows (registered by every rank, VMM memory from ncclMemAlloc). FSDP's
 * collectives overlap compute, and NCCL's SM kernels take SMs from every matmul they
 * overlap for as long as the transfer lasts; copy engines take none.
 * - All-gathers into a registered window go through that communicator.
 *   nccl.copy_engine_allgather = false turns this off.
 * Reduce-scatters need arithmetic and stay on NCCL's SM kernels (moving their data on the
 * copy engines as an all-to-all plus a summing kernel measured no faster on 2 H200s: the
 * step is bound by the bytes moved through HBM under the power cap). */
static int ce_enabled(void) {
#if defined(NCCL_CTA_POLICY_ZERO)
    return g_opt.nccl_copy_engine_allgather;
#else
    return 0;
#endif
}

static gather_window *find_window(const shlm_comm_group *g, const void *p) {
    for (gather_window *w = g->windows; w; w = w->next)
        if ((const char *)p >= (const char *)w->ptr && (const char *)p < (const char *)w->ptr + w->bytes)
            return w;
    return NULL;
}

/* A zero-filled symmetric window of `bytes` on every rank of g, or NULL on every rank.
 * Collective over g. */
static gather_window *window_alloc(shlm_comm_group *g, size_t bytes) {
#if defined(NCCL_CTA_POLICY_ZERO)
    if (!g->nccl) return NULL; /* one rank: nothing to gather from */
    if (!g->nccl_ce) {
        ncclUniqueId id;
        if (g->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
        MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, g->mpi));
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO;
        NCCL_CHECK(ncclCommInitRankConfig(&g->nccl_ce, g->size, id, g->rank, &cfg));
    }
    /* every rank must register, or none: agree before the collective registration */
    void *p = NULL;
    int ok = ncclMemAlloc(&p, bytes) == ncclSuccess, all_ok = 0;
    MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, g->mpi));
    if (!all_ok) {
        if (ok) ncclMemFree(p);
        return NULL;
    }
    gather_window *w = calloc(1, sizeof *w);
    SHLM_CHECK_ALLOC(w);
    w->ptr = p;
    w->bytes = bytes;
    NCCL_CHECK(ncclCommWindowRegister(g->nccl_ce, p, bytes, &w->win, NCCL_WIN_COLL_SYMMETRIC));
    CUDART_CHECK(cudaMemset(p, 0, bytes));
    return w;
#else
    (void)g, (void)bytes;
    return NULL;
#endif
}

static void window_free(shlm_comm_group *g, gather_window *w) {
    CUDART_CHECK(cudaStreamSynchronize(g->stream));
#if defined(NCCL_CTA_POLICY_ZERO)
    NCCL_CHECK(ncclCommWindowDeregister(g->nccl_ce, w->win));
#endif
    NCCL_CHECK(ncclMemFree(w->ptr));
    free(w);
}

static void *listed_window(shlm_comm_group *g, size_t bytes) {
    gather_window *w = window_alloc(g, bytes);
    if (!w) return NULL;
    w->next = g->windows;
    g->windows = w;
    return w->ptr;
}

static void *nccl_gather_buffer_alloc(shlm_comm_group *g, size_t bytes) {
    if (g->size < 2 || bytes == 0 || !ce_enabled()) return NULL;
    return listed_window(g, bytes);
}

static void nccl_registered_free(shlm_comm_group *g, void *p) {
    if (!p) return;
    for (gather_window **pp = &g->windows; *pp; pp = &(*pp)->next) {
        gather_window *w = *pp;
        if (w->ptr != p) continue;
        *pp = w->next;
        window_free(g, w);
        return;
    }
    SHLM_FATAL("registered_free: %p is not a registered buffer of this group", p);
}

static void nccl_group_free(shlm_comm_group *g) {
    if (!g) return;
    for (watch *w = g_watch; w; w = w->next)
        if (w->g == g && !w->detached)
            SHLM_FATAL("comm group freed with a request outstanding (every request must be waited)");
    CUDART_CHECK(cudaStreamSynchronize(g->stream));
    nccl_progress(); /* retire this group's finished entries */
    while (g->windows) nccl_registered_free(g, g->windows->ptr);
    if (g->nccl_ce) NCCL_CHECK(ncclCommDestroy(g->nccl_ce));
    if (g->nccl) NCCL_CHECK(ncclCommDestroy(g->nccl));
    CUDART_CHECK(cudaStreamDestroy(g->stream));
    MPI_CHECK(MPI_Comm_free(&g->mpi));
    free(g);
}

static int nccl_group_rank(const shlm_comm_group *g) { return g->rank; }
static int nccl_group_size(const shlm_comm_group *g) { return g->size; }

static void sleep_fn(void *arg) { usleep((useconds_t)(long)arg); }

/* Orders the group's stream after the compute stream's work so far (the send buffer
 * was written there), applies the test delay, and counts the bytes. */
static void begin(shlm_comm_group *g, shlm_comm_op op, size_t count, shlm_dtype dt) {
    cudaEvent_t ready;
    CUDART_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CUDART_CHECK(cudaEventRecord(ready, compute_stream()));
    CUDART_CHECK(cudaStreamWaitEvent(g->stream, ready, 0));
    CUDART_CHECK(cudaEventDestroy(ready)); /* released once the wait is satisfied */
    long delay = g->delay_us >= 0 ? g->delay_us : g_delay_us;
    if (delay > 0) CUDART_CHECK(cudaLaunchHostFunc(g->stream, sleep_fn, (void *)delay));
    const uint64_t es = shlm_dtype_size(dt), S = (uint64_t)g->size;
    uint64_t bytes = (op == SHLM_COMM_ALL_GATHER || op == SHLM_COMM_REDUCE_SCATTER)
                         ? S * count * es : count * es;
    uint64_t wire = 0;
    if (S > 1) {
        if (op == SHLM_COMM_ALL_REDUCE) wire = 2 * bytes * (S - 1) / S;
        else if (op == SHLM_COMM_BROADCAST) wire = bytes;
        else wire = bytes * (S - 1) / S;
    }
    g->stats.calls[op]++;
    g->stats.bytes[op] += bytes;
    g->stats.wire[op] += wire;
}

static shlm_comm_req *finish(shlm_comm_group *g, shlm_comm_op op) {
    watch *w = calloc(1, sizeof *w);
    shlm_comm_req *r = calloc(1, sizeof *r);
    SHLM_CHECK_ALLOC(w);
    SHLM_CHECK_ALLOC(r);
    CUDART_CHECK(cudaEventCreateWithFlags(&w->done, cudaEventDisableTiming));
    CUDART_CHECK(cudaEventRecord(w->done, g->stream));
    w->sw = shlm_watch_issue(shlm_comm_op_name(op), NULL, g->label, MPI_COMM_NULL);
    w->op = op;
    w->g = g;
    w->next = g_watch;
    g_watch = w;
    r->w = w;
    return r;
}

static void check_count(size_t count) {
    if (count > (size_t)1 << 40) SHLM_FATAL("collective of %zu elements is too large", count);
}

/* A collective on a group of one rank (no communicator): recv = send, on the group's
 * stream, so it is ordered and waited like any other. */
static void one_rank_copy(shlm_comm_group *g, const void *send, void *recv, size_t count,
                          shlm_dtype dt) {
    if (send && send != recv)
        CUDART_CHECK(cudaMemcpyAsync(recv, send, count * shlm_dtype_size(dt),
                                     cudaMemcpyDeviceToDevice, g->stream));
}

static shlm_comm_req *nccl_iall_gather(shlm_comm_group *g, const void *send, void *recv,
                                       size_t count, shlm_dtype dt) {
    check_count(count);
    begin(g, SHLM_COMM_ALL_GATHER, count, dt);
    /* in place: NCCL detects send == recv + rank·count itself */
    const void *src = send ? send : (const char *)recv + (size_t)g->rank * count * shlm_dtype_size(dt);
    /* into a registered window: the copy-engine communicator */
    ncclComm_t c = g->nccl_ce && find_window(g, recv) ? g->nccl_ce : g->nccl;
    if (c) NCCL_CHECK(ncclAllGather(src, recv, count, nccl_type(dt), c, g->stream));
    else one_rank_copy(g, src, recv, count, dt);
    return finish(g, SHLM_COMM_ALL_GATHER);
}

static shlm_comm_req *nccl_ireduce_scatter(shlm_comm_group *g, const void *send, void *recv,
                                           size_t count, shlm_dtype dt, shlm_comm_redop op) {
    check_count(count);
    begin(g, SHLM_COMM_REDUCE_SCATTER, count, dt);
    if (g->nccl)
        NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(dt), nccl_op(op), g->nccl, g->stream));
    else one_rank_copy(g, send, recv, count, dt); /* the sum or mean of one rank */
    return finish(g, SHLM_COMM_REDUCE_SCATTER);
}

static shlm_comm_req *nccl_iall_reduce(shlm_comm_group *g, const void *send, void *recv,
                                       size_t count, shlm_dtype dt, shlm_comm_redop op) {
    check_count(count);
    begin(g, SHLM_COMM_ALL_REDUCE, count, dt);
    if (g->nccl)
        NCCL_CHECK(ncclAllReduce(send ? send : recv, recv, count, nccl_type(dt), nccl_op(op),
                                 g->nccl, g->stream));
    else one_rank_copy(g, send, recv, count, dt);
    return finish(g, SHLM_COMM_ALL_REDUCE);
}

static shlm_comm_req *nccl_ibroadcast(shlm_comm_group *g, void *buf, size_t count, shlm_dtype dt,
                                      int root) {
    check_count(count);
    begin(g, SHLM_COMM_BROADCAST, count, dt);
    if (g->nccl) NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dt), root, g->nccl, g->stream));
    return finish(g, SHLM_COMM_BROADCAST);
}

/* "Complete" on this backend means ordered before the compute stream's next op: the
 * compute stream waits on the collective's event; the host does not block. The span
 * the compute stream stalls is measured with a pair of timed events. */
static void nccl_wait(shlm_comm_req *r) {
    if (!r) return;
    stall *s = calloc(1, sizeof *s);
    SHLM_CHECK_ALLOC(s);
    cudaStream_t cs = compute_stream();
    CUDART_CHECK(cudaEventCreate(&s->begin));
    CUDART_CHECK(cudaEventCreate(&s->end));
    CUDART_CHECK(cudaEventRecord(s->begin, cs));
    CUDART_CHECK(cudaStreamWaitEvent(cs, r->w->done, 0));
    CUDART_CHECK(cudaEventRecord(s->end, cs));
    s->g = r->w->g;
    s->next = g_stalls;
    g_stalls = s;
    r->w->detached = 1;
    free(r);
}

static int nccl_test(shlm_comm_req *r) {
    if (!r) return 1;
    cudaError_t e = cudaEventQuery(r->w->done);
    if (e == cudaErrorNotReady) return 0;
    CUDART_CHECK(e);
    return 1;
}

static void blocking(shlm_comm_req *r) { nccl_wait(r); }

static void nccl_all_gather(shlm_comm_group *g, const void *send, void *recv, size_t count,
                            shlm_dtype dt) {
    blocking(nccl_iall_gather(g, send, recv, count, dt));
}
static void nccl_reduce_scatter(shlm_comm_group *g, const void *send, void *recv, size_t count,
                                shlm_dtype dt, shlm_comm_redop op) {
    blocking(nccl_ireduce_scatter(g, send, recv, count, dt, op));
}
static void nccl_all_reduce(shlm_comm_group *g, const void *send, void *recv, size_t count,
                            shlm_dtype dt, shlm_comm_redop op) {
    blocking(nccl_iall_reduce(g, send, recv, count, dt, op));
}
static void nccl_broadcast(shlm_comm_group *g, void *buf, size_t count, shlm_dtype dt, int root) {
    blocking(nccl_ibroadcast(g, buf, count, dt, root));
}

static const char *op_name(shlm_comm_op op) { return shlm_comm_op_name(op); }

static void abort_group(void *group) {
    shlm_comm_group *g = group;
    if (g->nccl_ce) ncclCommAbort(g->nccl_ce);
    if (g->nccl) ncclCommAbort(g->nccl);
}

/* Retires finished collectives; aborts on an NCCL error or one unfinished past the
 * timeout (after the watchdog's roll call has named the ranks that did not arrive).
 * Answers other ranks' roll calls. Returns how many are still unfinished. */
static int nccl_progress(void) {
    shlm_watchdog_poll();
    int pending = 0;
    watch **pp = &g_watch;
    while (*pp) {
        watch *w = *pp;
        cudaError_t e = cudaEventQuery(w->done);
        if (e == cudaSuccess && w->detached) {
            *pp = w->next;
            cudaEventDestroy(w->done);
            free(w);
            continue;
        }
        if (e != cudaSuccess && e != cudaErrorNotReady)
            SHLM_FATAL("%s on a group of %d ranks failed on the GPU: %s", op_name(w->op),
                       w->g->size, cudaGetErrorString(e));
        if (e == cudaErrorNotReady) {
            pending++;
            ncclResult_t async = ncclSuccess, async_ce = ncclSuccess;
            if (w->g->nccl) NCCL_CHECK(ncclCommGetAsyncError(w->g->nccl, &async));
            if (w->g->nccl_ce) NCCL_CHECK(ncclCommGetAsyncError(w->g->nccl_ce, &async_ce));
            if (async == ncclSuccess || async == ncclInProgress) async = async_ce;
            if (async != ncclSuccess && async != ncclInProgress) {
                abort_group(w->g);
                SHLM_FATAL("NCCL %s on a group of %d ranks failed: %s", op_name(w->op),
                           w->g->size, ncclGetErrorString(async));
            }
            if (shlm_watch_expired(&w->sw)) shlm_watch_fail(&w->sw, abort_group, w->g);
        }
        pp = &w->next;
    }
    return pending;
}

static void nccl_set_delay_us(shlm_comm_group *g, long delay_us) {
    if (g) g->delay_us = delay_us;
    else g_delay_us = delay_us;
}

/* Adds the finished stall spans of every group to their blocked_ns. */
static void collect_stalls(void) {
    stall **pp = &g_stalls;
    while (*pp) {
        stall *s = *pp;
        if (cudaEventQuery(s->end) != cudaSuccess) {
            pp = &s->next;
            continue;
        }
        float ms = 0;
        CUDART_CHECK(cudaEventElapsedTime(&ms, s->begin, s->end));
        s->g->stats.blocked_ns += (uint64_t)(ms * 1e6);
        cudaEventDestroy(s->begin);
        cudaEventDestroy(s->end);
        *pp = s->next;
        free(s);
    }
}

static void nccl_stats(const shlm_comm_group *g, shlm_comm_stats *out) {
    collect_stalls();
    *out = g->stats;
}

static void nccl_stats_reset(shlm_comm_group *g) {
    collect_stalls();
    memset(&g->stats, 0, sizeof g->stats);
}

const shlm_comm shlm_comm_nccl = {
    .name = "nccl",
    .available = nccl_available,
    .init = nccl_init,
    .group_create = nccl_group_create,
    .group_free = nccl_group_free,
    .group_rank = nccl_group_rank,
    .group_size = nccl_group_size,
    .gather_buffer_alloc = nccl_gather_buffer_alloc,
    .registered_free = nccl_registered_free,
    .gather_buffers_enabled = ce_enabled,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .iall_gather = nccl_iall_gather,
    .ireduce_scatter = nccl_ireduce_scatter,
    .iall_reduce = nccl_iall_reduce,
    .ibroadcast = nccl_ibroadcast,
    .wait = nccl_wait,
    .test = nccl_test,
    .progress = nccl_progress,
    .set_delay_us = nccl_set_delay_us,
    .stats = nccl_stats,
    .stats_reset = nccl_stats_reset,
};
