/* The communication-backend interface: one table of collectives over opaque groups
 * per backend (mpi, nccl), chosen once at start-up by name; the FSDP engine drives it. */
#ifndef SHLM_COMM_H
#define SHLM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "kernels/ops.h" /* shlm_dtype */

/* A set of ranks that run collectives together, made from an MPI communicator. The
 * MPI backend keeps a private duplicate of it; the NCCL backend twins it with an NCCL
 * communicator (ncclGetUniqueId on rank 0, MPI_Bcast, ncclCommInitRank). */
typedef struct shlm_comm_group shlm_comm_group;

/* One collective in flight, returned by the non-blocking members. */
typedef struct shlm_comm_req shlm_comm_req;

/* Reductions. AVG is SUM followed by one division of this rank's result by the group
 * size, in fp32 (bf16 results: widen, divide, round to nearest even). Averages compose:
 * AVG in the shard group (S) then AVG in the replica group (R) divides by S·R, the
 * data-parallel world, which is what HYBRID_SHARD gradients need. */
typedef enum shlm_comm_redop { SHLM_COMM_SUM = 0, SHLM_COMM_AVG = 1 } shlm_comm_redop;

/* Collective kinds, indexing shlm_comm_stats. */
typedef enum shlm_comm_op {
    SHLM_COMM_ALL_GATHER = 0,
    SHLM_COMM_REDUCE_SCATTER,
    SHLM_COMM_ALL_REDUCE,
    SHLM_COMM_BROADCAST,
    SHLM_COMM_N_OPS
} shlm_comm_op;

static inline const char *shlm_comm_op_name(shlm_comm_op op) {
    static const char *const names[SHLM_COMM_N_OPS] = {"all_gather", "reduce_scatter",
                                                       "all_reduce", "broadcast"};
    return (unsigned)op < SHLM_COMM_N_OPS ? names[op] : "?";
}

/*
 * Counters of one group on this rank, since its creation or the last stats_reset.
 * Counted at issue, blocking and non-blocking alike, so they are exact whatever the
 * timing. With es = element size, S = group size, `count` as passed:
 *   bytes[op]  the collective's size as nccl-tests defines it ("size"):
 *              all_gather and reduce_scatter S·count·es (the whole buffer),
 *              all_reduce and broadcast count·es.
 *   wire[op]   the bytes this rank sends under a bandwidth-optimal (ring) algorithm,
 *              = bytes × nccl-tests' bus factor: (S-1)/S for all_gather and
 *              reduce_scatter, 2(S-1)/S for all_reduce (integer division, exact when
 *              count is a multiple of S), 1 for broadcast; 0 when S = 1.
 *              `plan` predicts these; wire / time is the bus bandwidth.
 *   blocked_ns time the caller spent inside blocking collectives and wait(): the
 *              communication the compute did not hide ("comm_exposed_ms").
 */
typedef struct shlm_comm_stats {
    uint64_t calls[SHLM_COMM_N_OPS];
    uint64_t bytes[SHLM_COMM_N_OPS];
    uint64_t wire[SHLM_COMM_N_OPS];
    uint64_t blocked_ns;
} shlm_comm_stats;

/* NCCL's CTA policy for the communicators' kernels (nccl.cta_policy): NCCL's default, or
 * as few SMs as keep them decent (NCCL_CTA_POLICY_EFFICIENCY, NCCL 2.27 and later). */
typedef enum shlm_nccl_cta_policy {
    SHLM_NCCL_CTA_DEFAULT = 0,
    SHLM_NCCL_CTA_EFFICIENCY = 1
} shlm_nccl_cta_policy;

/* What a comm backend takes at start-up (init), from the job's [nccl] keys. */
typedef struct shlm_comm_options {
    shlm_nccl_cta_policy nccl_cta_policy;
    int nccl_copy_engine_allgather; /* 1: all-gathers into registered windows run on the
                                     * copy engines (where NCCL can) */
} shlm_comm_options;

/*
 * Conventions (every member):
 * - Buffers are in the backend's memory: host for mpi (it runs with the cpu compute
 *   backend), device for nccl. `count` is in elements of `dt` (SHLM_F32 or SHLM_BF16)
 *   and at most INT_MAX per rank; es below is shlm_dtype_size(dt).
 * - Collectives: every rank of the group calls the same members in the same order with
 *   the same count/dt/op/root (MPI's rule; blocking and non-blocking ones share one
 *   order per group). Groups are independent of one another.
 * - In place follows NCCL's convention, so both backends take the same pointers:
 *   all_gather     send == recv + rank·count·es (the rank's own slice), or send == NULL;
 *   reduce_scatter recv == send + rank·count·es; after it only the rank's slice of
 *                  send is defined (the rest is scratch);
 *   all_reduce     send == recv, or send == NULL.
 *   Any other overlap of send and recv is undefined.
 * - bf16 reductions sum pairs in fp32 and round each partial sum to bf16 (nearest
 *   even), as NCCL does hop by hop: bf16 stays bf16 on the wire (half the bytes of
 *   fp32), and the result is bit-identical on every rank and from run to run for a
 *   given group size and count. It can differ in the last bit from another group size
 *   or backend, because the order of the partial sums does.
 * - Non-blocking members (i*) return a request; until wait() returns, the caller must
 *   not touch recv (nor send, nor buf). Every request goes to wait() exactly once; it
 *   frees it. "Complete" means: results may be read by the compute backend's next op
 *   (mpi: on the host, now; nccl: ordered on the compute stream).
 * - Progress: Open MPI advances non-blocking collectives (libnbc) mostly while the
 *   process is inside an MPI call. A compute loop overlapping communication should call
 *   progress() every few milliseconds of work (between layers or matmul tiles), from the
 *   thread that called MPI_Init_thread, outside OpenMP parallel regions. Without it the
 *   transfer may only start in wait(), and nothing overlaps.
 * - Not thread-safe: one thread issues, tests and waits (MPI_THREAD_FUNNELED suffices).
 * - MPI errors abort the job through MPI_CHECK with the call, rank and host.
 * - A collective unfinished runtime.comm_timeout_s after its issue ends the job, naming the
 *   ranks that did not arrive (kernels/comm/comm_watchdog.h): wait() and progress() check it,
 *   and the blocking members too (the MPI backend issues them non-blocking and waits).
 */
typedef struct shlm_comm {
    const char *name; /* "mpi" or "nccl" */
    /* 1 when the backend can run here (nccl: a GPU and NCCL are present) */
    int (*available)(void);
    /* Optional (NULL: no options): applies o; called once at start-up, before the first
     * group_create. */
    void (*init)(const shlm_comm_options *o);

    /* ---- groups ---- */
    /* Collective over comm (every member calls it). The caller keeps ownership of comm. */
    shlm_comm_group *(*group_create)(MPI_Comm comm);
    /* Collective. No request of the group may be outstanding. NULL is fine. */
    void (*group_free)(shlm_comm_group *g);
    int (*group_rank)(const shlm_comm_group *g);
    int (*group_size)(const shlm_comm_group *g);
    /* Optional (NULL where unsupported): zero-filled device memory for the receive
     * buffers of g's all-gathers, registered with every rank of g so that all-gathers
     * into it run on the copy engines and leave the SMs to compute. Collective over g
     * (same bytes on every rank). Returns NULL (on every rank) when it cannot; the
     * caller then allocates as usual. Freed by registered_free (collective). */
    void *(*gather_buffer_alloc)(shlm_comm_group *g, size_t bytes);
    void (*registered_free)(shlm_comm_group *g, void *p);
    /* Optional: 1 when gather_buffer_alloc is enabled (the memory it returns is then not
     * carved from the compute backend's arena). */
    int (*gather_buffers_enabled)(void);

    /* ---- blocking collectives: results are ready on return ---- */
    /* recv (S·count) = concatenation of every rank's send (count), rank order */
    void (*all_gather)(shlm_comm_group *g, const void *send, void *recv, size_t count,
                       shlm_dtype dt);
    /* recv (count) = op over ranks of send[rank·count, (rank+1)·count); send is S·count */
    void (*reduce_scatter)(shlm_comm_group *g, const void *send, void *recv, size_t count,
                           shlm_dtype dt, shlm_comm_redop op);
    /* recv (count) = op over ranks of send (count) */
    void (*all_reduce)(shlm_comm_group *g, const void *send, void *recv, size_t count,
                       shlm_dtype dt, shlm_comm_redop op);
    /* buf (count) on every rank = buf of group rank `root` */
    void (*broadcast)(shlm_comm_group *g, void *buf, size_t count, shlm_dtype dt, int root);

    /* ---- non-blocking twins: same arguments, return a request for wait() ---- */
    shlm_comm_req *(*iall_gather)(shlm_comm_group *g, const void *send, void *recv,
                                  size_t count, shlm_dtype dt);
    shlm_comm_req *(*ireduce_scatter)(shlm_comm_group *g, const void *send, void *recv,
                                      size_t count, shlm_dtype dt, shlm_comm_redop op);
    shlm_comm_req *(*iall_reduce)(shlm_comm_group *g, const void *send, void *recv,
                                  size_t count, shlm_dtype dt, shlm_comm_redop op);
    shlm_comm_req *(*ibroadcast)(shlm_comm_group *g, void *buf, size_t count, shlm_dtype dt,
                                 int root);
    /* Blocks until req is complete, then frees it. NULL is fine (returns at once). */
    void (*wait)(shlm_comm_req *req);
    /* 1 when req is complete (results readable), else 0. Never frees: wait() still
     * must be called, and then returns at once. */
    int (*test)(shlm_comm_req *req);
    /* Advances every outstanding request of every group and returns how many are not yet
     * complete; also answers the watchdog's roll calls and ends the job on a collective
     * past its deadline. Cheap (one MPI_Test each); call it often while computing. */
    int (*progress)(void);

    /* ---- measurement ---- */
    /* Benchmarks and tests only: every collective of group g (g == NULL: of every group
     * that has no delay of its own) completes no earlier than delay_us microseconds
     * after it was issued; wait() and blocking calls sleep out the remainder and test()
     * says 0 until then. So compute that outlasts the delay hides it, and compute that
     * does not shows it as blocked time. 0 turns it off; a group set to -1 follows the
     * backend-wide value again. */
    void (*set_delay_us)(shlm_comm_group *g, long delay_us);
    /* Copies g's counters into *out. */
    void (*stats)(const shlm_comm_group *g, shlm_comm_stats *out);
    void (*stats_reset)(shlm_comm_group *g);
} shlm_comm;

/* The MPI backend (always built). */
extern const shlm_comm shlm_comm_mpi;

/* Comm backends compiled into this build, NULL-terminated, and the one named `name`
 * ("mpi", "nccl") or NULL; defined next to the compute-backend list (kernels/backends/backends.c). */
extern const shlm_comm *const shlm_comm_backends[];
const shlm_comm *shlm_comm_find(const char *name);

#endif
