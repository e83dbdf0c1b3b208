/* The MPI comm backend (see comm.h): host buffers, every collective an MPI_I* one whose
 * wait has a deadline (comm_watchdog.h), bf16 reductions through a user-defined MPI_Op. */
#include <mpi.h>

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/bf16.h"
#include "kernels/check.h"
#include "kernels/comm.h"
#include "kernels/comm/comm_watchdog.h"

struct shlm_comm_group {
    MPI_Comm comm;    /* our duplicate: our traffic never matches the caller's */
    int rank, size;
    long delay_us;    /* < 0: follow the backend-wide default_delay_us */
    int n_inflight;   /* requests not yet waited for; group_free checks it */
    shlm_comm_stats stats;
    char label[160];  /* "shard group (ranks 0-3)", for the watchdog's messages */
};

struct shlm_comm_req {
    shlm_comm_group *g;
    MPI_Request mpi;
    int mpi_done;     /* MPI reported completion */
    int finished;     /* post-processing (shift, average) done */
    int64_t deadline_ns;  /* runtime.comm_delay_us: not complete before this */
    int64_t issued_ns;    /* a blocking call's issue: its blocked time counts from here */
    shlm_watch watch;     /* runtime.comm_timeout_s: the job ends past this one's deadline */
    /* post-processing on completion */
    const void *move_src; /* in-place reduce_scatter: MPI leaves the result at the */
    void *move_dst;       /*   start of the buffer, NCCL's convention wants it at the */
                          /*   rank's offset */
    void *avg_dst;        /* AVG: divide these count elements by the group size */
    size_t count;
    shlm_dtype dt;
    struct shlm_comm_req *prev, *next; /* the in-flight list progress() walks */
};

static long default_delay_us = 0;
static shlm_comm_req *inflight = NULL;

/* bf16 as MPI sees it: a named 2-byte type and a sum over it. A derived type rather
 * than MPI_UINT16_T so that a predefined MPI_SUM can never silently add the raw bits
 * as integers. Created on the first group_create (after MPI_Init), kept until
 * MPI_Finalize. */
static MPI_Datatype bf16_type = MPI_DATATYPE_NULL;
static MPI_Op bf16_sum = MPI_OP_NULL;

/* ---- helpers ---- */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Sleeps until the monotonic clock reaches t (absolute, so early wake-ups by signals
 * do not shorten the delay). */
static void sleep_until_ns(int64_t t) {
    struct timespec ts = {.tv_sec = t / 1000000000, .tv_nsec = t % 1000000000};
    while (now_ns() < t && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* inout[i] = bf16(fp32(in[i]) + fp32(inout[i])). One fp32 addition is commutative
 * bit for bit, so the op is declared commutative and every rank's all_reduce result
 * is identical. */
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = shlm_f32_to_bf16(shlm_bf16_to_f32(a[i]) + shlm_bf16_to_f32(b[i]));
}

static void bf16_init(void) {
    if (bf16_type != MPI_DATATYPE_NULL) return;
    MPI_CHECK(MPI_Type_contiguous(1, MPI_UINT16_T, &bf16_type));
    MPI_CHECK(MPI_Type_set_name(bf16_type, "shlm_bf16"));
    MPI_CHECK(MPI_Type_commit(&bf16_type));
    MPI_CHECK(MPI_Op_create(bf16_sum_fn, 1, &bf16_sum));
}

static MPI_Datatype mpi_type(shlm_dtype dt) { return dt == SHLM_BF16 ? bf16_type : MPI_FLOAT; }
static MPI_Op mpi_sum(shlm_dtype dt) { return dt == SHLM_BF16 ? bf16_sum : MPI_SUM; }

static void check_args(const shlm_comm_group *g, const char *what, size_t count, shlm_dtype dt) {
    if (g == NULL) SHLM_FATAL("comm mpi: %s on a NULL group", what);
    if (dt != SHLM_F32 && dt != SHLM_BF16)
        SHLM_FATAL("comm mpi: %s: unsupported dtype %d (fp32 and bf16 only)", what, (int)dt);
    if (count > (size_t)INT_MAX)
        SHLM_FATAL("comm mpi: %s: count %zu exceeds MPI's limit of %d elements per rank; "
                   "split the buffer", what, count, INT_MAX);
}

/* x[i] /= S, in fp32 (bf16 widened and rounded back). Division rather than a product
 * with 1/S: correctly rounded, so exact whenever the average is representable, which
 * a rounded 1/S (S = 3, 6, ...) would not guarantee. */
static void divide_by(void *x, size_t n, shlm_dtype dt, int S) {
    float s = (float)S;
    if (dt == SHLM_F32) {
        float *f = x;
        for (size_t i = 0; i < n; i++) f[i] /= s;
    } else {
        uint16_t *h = x;
        for (size_t i = 0; i < n; i++) h[i] = shlm_f32_to_bf16(shlm_bf16_to_f32(h[i]) / s);
    }
}

static void finish(shlm_comm_req *r) {
    if (r->finished) return;
    size_t es = shlm_dtype_size(r->dt);
    if (r->move_dst != NULL && r->move_dst != r->move_src)
        memmove(r->move_dst, r->move_src, r->count * es);
    if (r->avg_dst != NULL && r->g->size > 1) divide_by(r->avg_dst, r->count, r->dt, r->g->size);
    r->finished = 1;
}

/* The start of every collective: checks the arguments, ties r to g, counts the call,
 * sets its delay and puts it under watch; counted at issue so the counters do not depend
 * on when (or whether) anyone tests. */
static void issue(shlm_comm_req *r, shlm_comm_group *g, shlm_comm_op op, size_t count,
                  shlm_dtype dt) {
    check_args(g, shlm_comm_op_name(op), count, dt);
    r->g = g;
    uint64_t S = (uint64_t)g->size, es = shlm_dtype_size(dt), n = (uint64_t)count * es;
    uint64_t bytes = 0, wire = 0;
    switch (op) {
    case SHLM_COMM_ALL_GATHER:
    case SHLM_COMM_REDUCE_SCATTER: bytes = S * n; wire = (S - 1) * n; break;
    case SHLM_COMM_ALL_REDUCE: bytes = n; wire = 2 * (S - 1) * n / S; break;
    case SHLM_COMM_BROADCAST: bytes = n; wire = S > 1 ? n : 0; break;
    default: break;
    }
    g->stats.calls[op]++;
    g->stats.bytes[op] += bytes;
    g->stats.wire[op] += wire;
    long d = g->delay_us >= 0 ? g->delay_us : default_delay_us;
    r->deadline_ns = now_ns() + (int64_t)d * 1000;
    r->count = count;
    r->dt = dt;
    r->watch = shlm_watch_issue(shlm_comm_op_name(op), NULL, g->label, g->comm);
}

/* ---- one code path per collective: issued non-blocking, the blocking members wait ---- */

static shlm_comm_req *start_all_gather(shlm_comm_req *r, shlm_comm_group *g,
                                       const void *send, void *recv, size_t count,
                                       shlm_dtype dt) {
    issue(r, g, SHLM_COMM_ALL_GATHER, count, dt);
    const char *own = (const char *)recv + (size_t)g->rank * count * shlm_dtype_size(dt);
    const void *sbuf = (send == NULL || send == own) ? MPI_IN_PLACE : send;
    MPI_Datatype t = mpi_type(dt);
    MPI_CHECK(MPI_Iallgather(sbuf, (int)count, t, recv, (int)count, t, g->comm, &r->mpi));
    return r;
}

static shlm_comm_req *start_reduce_scatter(shlm_comm_req *r, shlm_comm_group *g,
                                           const void *send, void *recv, size_t count,
                                           shlm_dtype dt, shlm_comm_redop op) {
    issue(r, g, SHLM_COMM_REDUCE_SCATTER, count, dt);
    const char *own = (const char *)send + (size_t)g->rank * count * shlm_dtype_size(dt);
    const void *sbuf = send;
    void *rbuf = recv;
    if (recv == own) {
        /* MPI's in-place form reads the whole buffer and writes the result at its
         * start; finish() moves it to the rank's offset */
        sbuf = MPI_IN_PLACE;
        rbuf = (void *)send;
        r->move_src = send;
        r->move_dst = recv;
    }
    if (op == SHLM_COMM_AVG) r->avg_dst = recv;
    MPI_Datatype t = mpi_type(dt);
    MPI_CHECK(MPI_Ireduce_scatter_block(sbuf, rbuf, (int)count, t, mpi_sum(dt), g->comm, &r->mpi));
    return r;
}

static shlm_comm_req *start_all_reduce(shlm_comm_req *r, shlm_comm_group *g,
                                       const void *send, void *recv, size_t count,
                                       shlm_dtype dt, shlm_comm_redop op) {
    issue(r, g, SHLM_COMM_ALL_REDUCE, count, dt);
    const void *sbuf = (send == NULL || send == recv) ? MPI_IN_PLACE : send;
    if (op == SHLM_COMM_AVG) r->avg_dst = recv;
    MPI_Datatype t = mpi_type(dt);
    MPI_CHECK(MPI_Iallreduce(sbuf, recv, (int)count, t, mpi_sum(dt), g->comm, &r->mpi));
    return r;
}

static shlm_comm_req *start_broadcast(shlm_comm_req *r, shlm_comm_group *g, void *buf,
                                      size_t count, shlm_dtype dt, int root) {
    issue(r, g, SHLM_COMM_BROADCAST, count, dt);
    if (root < 0 || root >= g->size)
        SHLM_FATAL("comm mpi: broadcast root %d outside the group of %d ranks", root, g->size);
    MPI_CHECK(MPI_Ibcast(buf, (int)count, mpi_type(dt), root, g->comm, &r->mpi));
    return r;
}

/* A blocking call: wait (with the watchdog's deadline), sleep out the delay,
 * post-process, count the whole time from issue (r->issued_ns) as blocked. Its request
 * lives on the caller's stack. */
static void end_blocking(shlm_comm_req *r) {
    MPI_CHECK(shlm_watch_wait(&r->mpi, &r->watch));
    sleep_until_ns(r->deadline_ns);
    finish(r);
    r->g->stats.blocked_ns += (uint64_t)(now_ns() - r->issued_ns);
}

/* A request for a non-blocking call, already on the in-flight list. */
static shlm_comm_req *new_req(shlm_comm_group *g) {
    if (g == NULL) SHLM_FATAL("comm mpi: collective on a NULL group");
    shlm_comm_req *r = calloc(1, sizeof *r);
    SHLM_CHECK_ALLOC(r);
    g->n_inflight++;
    r->next = inflight;
    if (inflight) inflight->prev = r;
    inflight = r;
    return r;
}

/* ---- the table's members ---- */

static int mpi_available(void) { return 1; }

static shlm_comm_group *mpi_group_create(MPI_Comm comm) {
    if (comm == MPI_COMM_NULL) SHLM_FATAL("comm mpi: group_create on MPI_COMM_NULL");
    bf16_init();
    shlm_comm_group *g = calloc(1, sizeof *g);
    SHLM_CHECK_ALLOC(g);
    MPI_CHECK(MPI_Comm_dup(comm, &g->comm));
    /* errors come back as codes so MPI_CHECK can name the call, rank and host */
    MPI_CHECK(MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(g->comm, &g->rank));
    MPI_CHECK(MPI_Comm_size(g->comm, &g->size));
    shlm_comm_describe(comm, g->label, sizeof g->label);
    g->delay_us = -1;
    return g;
}

static void mpi_group_free(shlm_comm_group *g) {
    if (g == NULL) return;
    if (g->n_inflight > 0)
        SHLM_FATAL("comm mpi: group_free with %d request(s) not waited for", g->n_inflight);
    MPI_CHECK(MPI_Comm_free(&g->comm));
    free(g);
}

static int mpi_group_rank(const shlm_comm_group *g) { return g->rank; }
static int mpi_group_size(const shlm_comm_group *g) { return g->size; }

static void mpi_all_gather(shlm_comm_group *g, const void *send, void *recv, size_t count,
                           shlm_dtype dt) {
    shlm_comm_req r = {.issued_ns = now_ns()};
    end_blocking(start_all_gather(&r, g, send, recv, count, dt));
}

static void mpi_reduce_scatter(shlm_comm_group *g, const void *send, void *recv, size_t count,
                               shlm_dtype dt, shlm_comm_redop op) {
    shlm_comm_req r = {.issued_ns = now_ns()};
    end_blocking(start_reduce_scatter(&r, g, send, recv, count, dt, op));
}

static void mpi_all_reduce(shlm_comm_group *g, const void *send, void *recv, size_t count,
                           shlm_dtype dt, shlm_comm_redop op) {
    shlm_comm_req r = {.issued_ns = now_ns()};
    end_blocking(start_all_reduce(&r, g, send, recv, count, dt, op));
}

static void mpi_broadcast(shlm_comm_group *g, void *buf, size_t count, shlm_dtype dt, int root) {
    shlm_comm_req r = {.issued_ns = now_ns()};
    end_blocking(start_broadcast(&r, g, buf, count, dt, root));
}

static shlm_comm_req *mpi_iall_gather(shlm_comm_group *g, const void *send, void *recv,
                                      size_t count, shlm_dtype dt) {
    return start_all_gather(new_req(g), g, send, recv, count, dt);
}

static shlm_comm_req *mpi_ireduce_scatter(shlm_comm_group *g, const void *send, void *recv,
                                          size_t count, shlm_dtype dt, shlm_comm_redop op) {
    return start_reduce_scatter(new_req(g), g, send, recv, count, dt, op);
}

static shlm_comm_req *mpi_iall_reduce(shlm_comm_group *g, const void *send, void *recv,
                                      size_t count, shlm_dtype dt, shlm_comm_redop op) {
    return start_all_reduce(new_req(g), g, send, recv, count, dt, op);
}

static shlm_comm_req *mpi_ibroadcast(shlm_comm_group *g, void *buf, size_t count,
                                     shlm_dtype dt, int root) {
    return start_broadcast(new_req(g), g, buf, count, dt, root);
}

static void poll_mpi(shlm_comm_req *r) {
    if (r->mpi_done) return;
    int flag = 0;
    MPI_CHECK(MPI_Test(&r->mpi, &flag, MPI_STATUS_IGNORE));
    r->mpi_done = flag;
}

static void mpi_wait(shlm_comm_req *r) {
    if (r == NULL) return;
    int64_t t0 = now_ns();
    if (!r->mpi_done) MPI_CHECK(shlm_watch_wait(&r->mpi, &r->watch));
    r->mpi_done = 1;
    sleep_until_ns(r->deadline_ns);
    finish(r);
    r->g->stats.blocked_ns += (uint64_t)(now_ns() - t0);
    r->g->n_inflight--;
    if (r->prev) r->prev->next = r->next;
    else inflight = r->next;
    if (r->next) r->next->prev = r->prev;
    free(r);
}

static int mpi_test(shlm_comm_req *r) {
    if (r == NULL) return 1;
    poll_mpi(r);
    if (!r->mpi_done || now_ns() < r->deadline_ns) return 0;
    finish(r);
    return 1;
}

/* Only MPI_Test here: finish()'s copies and divisions are left to test()/wait() so a
 * progress() call in the middle of compute stays a few microseconds. A request still
 * unfinished past its deadline ends the job here too, so a loop over progress() cannot
 * spin forever. */
static int mpi_progress(void) {
    int pending = 0;
    int64_t t = now_ns();
    shlm_watchdog_poll();
    for (shlm_comm_req *r = inflight; r != NULL; r = r->next) {
        poll_mpi(r);
        if (!r->mpi_done && shlm_watch_expired(&r->watch)) shlm_watch_fail(&r->watch, NULL, NULL);
        pending += !r->mpi_done || t < r->deadline_ns;
    }
    return pending;
}

static void mpi_set_delay_us(shlm_comm_group *g, long delay_us) {
    if (g == NULL) default_delay_us = delay_us > 0 ? delay_us : 0;
    else g->delay_us = delay_us < 0 ? -1 : delay_us;
}

static void mpi_stats(const shlm_comm_group *g, shlm_comm_stats *out) { *out = g->stats; }
static void mpi_stats_reset(shlm_comm_group *g) { memset(&g->stats, 0, sizeof g->stats); }

const shlm_comm shlm_comm_mpi = {
    .name = "mpi",
    .available = mpi_available,
    .group_create = mpi_group_create,
    .group_free = mpi_group_free,
    .group_rank = mpi_group_rank,
    .group_size = mpi_group_size,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .iall_gather = mpi_iall_gather,
    .ireduce_scatter = mpi_ireduce_scatter,
    .iall_reduce = mpi_iall_reduce,
    .ibroadcast = mpi_ibroadcast,
    .wait = mpi_wait,
    .test = mpi_test,
    .progress = mpi_progress,
    .set_delay_us = mpi_set_delay_us,
    .stats = mpi_stats,
    .stats_reset = mpi_stats_reset,
};
