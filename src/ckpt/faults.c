/* The test hooks of a checkpoint save and load (checkpoint.h): a rank that stops, dies or
 * writes slowly at a named point of the protocol, to test what the others do. Each does
 * nothing unless its variable names this rank (and this step). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/errmsg.h"
#include "kernels/comm/comm_watchdog.h"
#include "src/ckpt/ckpt_internal.h"

/* Whether hook `var` = RANK[:STEP] hits this rank in the save or load of `step` (-1: a
 * load, which takes no STEP). */
static int armed(const char *var, int rank, int64_t step) {
    const char *v = getenv(var);
    if (!v || !*v) return 0;
    long r = -1;
    long long s = -1;
    int n = sscanf(v, "%ld:%lld", &r, &s);
    return n >= 1 && r == rank && (n == 1 || s == step);
}

/* SHLM_TEST_STOP_IN_*: this rank stops (SIGSTOP) where it stands, `where` saying so. */
static void stop_here(const char *var, int rank, const char *where) {
    fprintf(stderr, "shardlm: %s: rank %d stops itself (SIGSTOP) %s\n", var, rank, where);
    fflush(stderr);
    raise(SIGSTOP);
}

void ckpt_fault_save_created(int rank, int64_t step) {
    if (armed("SHLM_TEST_STOP_IN_SAVE", rank, step))
        stop_here("SHLM_TEST_STOP_IN_SAVE", rank, "in the save, its file created");
}

void ckpt_fault_save_dataset_written(int rank, int64_t step, int done, int total,
                                     const char *file) {
    if (done != total / 2 || !armed("SHLM_TEST_KILL_IN_SAVE", rank, step)) return;
    fprintf(stderr, "shardlm: SHLM_TEST_KILL_IN_SAVE: rank %d raises SIGKILL after %d of %d "
            "datasets of %s\n", rank, done, total, file);
    fflush(stderr);
    raise(SIGKILL);
}

void ckpt_fault_save_write_error(int rank, int64_t step, int done, int total,
                                 const char *file, int *ok, char *err, size_t errlen) {
    if (done != total / 2 || !*ok || !armed("SHLM_TEST_WRITE_ERROR", rank, step)) return;
    io_set_err(err, errlen, "%s: rank %d's write failed: input/output error "
               "(SHLM_TEST_WRITE_ERROR)", file, rank);
    *ok = 0;
}

void ckpt_fault_save_data_written(int rank, int64_t step) {
    if (!armed("SHLM_TEST_SLOW_SAVE", rank, step)) return;
    /* a disk this slow: the others wait for this rank through two roll calls */
    const double secs = 2 * shlm_comm_timeout_s();
    fprintf(stderr, "shardlm: SHLM_TEST_SLOW_SAVE: rank %d takes %.0f s more to write its "
            "data\n", rank, secs);
    fflush(stderr);
    struct timespec left = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
}

void ckpt_fault_load_opened(int rank) {
    if (armed("SHLM_TEST_STOP_IN_LOAD", rank, -1))
        stop_here("SHLM_TEST_STOP_IN_LOAD", rank, "in the load, its file open");
}

int ckpt_fault_no_space_check(void) {
    const char *v = getenv("SHLM_TEST_NO_SPACE_CHECK");
    return v && strcmp(v, "1") == 0;
}
