/* Deadlines for collectives: a collective unfinished runtime.comm_timeout_s after this rank
 * issued it ends the job, and a roll call over the world first finds which ranks did not
 * arrive, so the one line printed names them and the operation. Used by both comm
 * backends and by the host reductions of a training step (shlm_timed_allreduce). */
#ifndef SHLM_COMM_WATCHDOG_H
#define SHLM_COMM_WATCHDOG_H

#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

/*
 * The roll call. The first rank whose collective passes its deadline sends "I wait in
 * operation #k" to every other rank over a private duplicate of the world and listens for
 * a grace period (a quarter of the timeout, 0.5 to 5 s). Every rank answers from its own
 * timed waits and from the comm backend's progress() (which the model calls between ops),
 * so a rank that is alive answers within milliseconds; a rank that is stopped (SIGSTOP),
 * dead, or stuck where it never polls cannot, and is named as not arrived. A rank that
 * has heard an alarm raises none of its own; of ranks raising theirs at the same moment
 * the lowest prints
 *   shardlm: error: <op> #<k> on <group> did not complete within <T> s (rank <r>): rank <s>
 *   did not arrive (no answer in <g> s: stopped, hung or dead); ranks ... wait in ...
 * and calls MPI_Abort. When every rank answers (collectives issued in different orders,
 * say) the line lists what each rank waits for instead. Ranks number collectives in issue
 * order across all groups, so equal numbers mean the same point of the program.
 */

/* The deadline of every collective, seconds: shlm_watchdog_init's, 600 before it. */
double shlm_comm_timeout_s(void);

/* Collective over `world` (once, after MPI_Init and the job's keys): sets the timeout
 * (runtime.comm_timeout_s; -1 with err when it is not a positive number) and duplicates
 * world for the roll call. Without it a passed deadline still ends the job naming the
 * operation, but no rank. */
int shlm_watchdog_init(MPI_Comm world, double timeout_s, char *err, size_t errlen);

/* A collective under watch, from its issue. */
typedef struct shlm_watch {
    uint64_t seq;      /* this rank's number for it: 1, 2, ... in issue order */
    double issued_s;   /* CLOCK_MONOTONIC */
    const char *op;    /* "all_gather", "MPI_Allreduce" (static storage) */
    const char *where; /* the calling function, or NULL (static storage) */
    const char *group; /* "shard group (ranks 0-3)", living as long as the collective; or
                        * NULL: `comm` is described when a message needs it */
    MPI_Comm comm;
} shlm_watch;

/* Numbers and stamps a collective being issued. */
shlm_watch shlm_watch_issue(const char *op, const char *where, const char *group, MPI_Comm comm);

/* 1 when w's deadline has passed (a clock read). */
int shlm_watch_expired(const shlm_watch *w);

/* Completes req by MPI_Test in a loop, answering roll calls meanwhile; when w's deadline
 * passes first, shlm_watch_fail. Inside a guarded region (below) the region's deadline
 * applies instead: the wait goes on while every rank answers the region's roll calls, up
 * to its limit. Returns MPI_Test's error code (MPI_SUCCESS). */
int shlm_watch_wait(MPI_Request *req, const shlm_watch *w);

/* w's deadline passed: the roll call, the line, before_abort(ctx) when given (the NCCL
 * backend aborts its communicators), then MPI_Abort. */
void shlm_watch_fail(const shlm_watch *w, void (*before_abort)(void *), void *ctx)
    __attribute__((noreturn));

/* Answers other ranks' roll calls: cheap (a clock read) unless a millisecond has passed
 * since the last look. Comm backends call it from progress(). */
void shlm_watchdog_poll(void);

/* MPI_Allreduce with the same arguments and result, waited for by shlm_watch_wait: the
 * host reductions of a training step (loss, step time, gradient norm) go through it, so
 * a rank that never arrives ends the job instead of blocking it. */
int shlm_timed_allreduce_at(const char *where, const void *send, void *recv, int count,
                            MPI_Datatype dt, MPI_Op op, MPI_Comm comm);
#define shlm_timed_allreduce(...) shlm_timed_allreduce_at(__func__, __VA_ARGS__)

/* "NAME (ranks A-B,C)": comm's name (MPI_Comm_set_name; "a group" when it has none) and
 * its members' world ranks, cut to fit len. For messages; local. */
void shlm_comm_describe(MPI_Comm comm, char *buf, size_t len);

/*
 * Guarded regions: code whose collectives cannot be timed from this thread. A checkpoint
 * save or load calls parallel HDF5, whose collectives (H5Fcreate -> MPI_File_open,
 * H5Fflush -> MPI_Barrier, collective H5Dwrite, H5Fclose) block inside MPI where no timed
 * wait polls. Between shlm_guard_begin and shlm_guard_end a thread of the watchdog keeps
 * this rank's side of the roll call instead:
 *  - it answers other ranks' roll calls for this rank ("in checkpoint save of step 3:
 *    writing the metadata"), so a rank busy in a long, live save answers;
 *  - once this rank has been in one phase (shlm_guard_phase) for runtime.comm_timeout_s,
 *    it runs a roll call: a rank that does not answer within the grace (stopped, dead,
 *    its whole process hung) ends the job with the collectives' line, the region and
 *    phase in place of the operation; when every rank answers the region goes on (a slow
 *    disk is not a hang) and the next roll call comes one timeout later;
 *  - past limit_s from the begin the job ends although every rank answers, the line
 *    saying where each rank is, then limit_note (how the caller set the limit): a rank
 *    stuck in its file system answers from this thread but never finishes.
 * So a rank that stops inside a region ends the job within one to two timeouts plus the
 * grace, and a region whose ranks all live may take up to limit_s. A timed collective
 * inside a region (shlm_watch_wait; the ranks of a save agreeing on its outcome), made by
 * the thread that began it, waits under these rules, not under its own deadline: the
 * others wait there for a rank that writes slowly, which must not end the job. Another
 * thread's collectives (training beside a checkpoint written in the background) keep
 * their own deadlines.
 * The thread calls MPI while the main thread is inside MPI: it needs MPI_THREAD_MULTIPLE
 * (the CLI asks for it). Without it (or before shlm_watchdog_init) there is no roll call:
 * past limit_s the rank prints the line without the ranks and exits, which ends the job
 * under mpirun and srun. While a region runs, the main thread need not answer roll calls
 * (it does only from a timed wait); the thread blocks the asynchronous signals (they stay
 * the main thread's). Regions nest: an inner begin and end only count. what is copied;
 * limit_note and phase are static text. */
void shlm_guard_begin(const char *what, double limit_s, const char *limit_note);
/* Where this rank is in the region (its status in roll calls and in the line); restarts
 * the phase's clock. Outside a region: nothing. */
void shlm_guard_phase(const char *phase);
/* Ends the region: the thread finishes (a roll call under way included) and is joined. */
void shlm_guard_end(void);

/* Test hook: SHLM_TEST_STOP_AT=RANK:STEP makes world rank RANK raise SIGSTOP at the start
 * of step STEP (1-based, as logged), to test that the others end the job. */
void shlm_watchdog_test_stop(int world_rank, long step);

#endif
