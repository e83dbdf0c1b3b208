/* Deadlines of the checkpoint operations: every collective function of src/ckpt/ runs as a
 * guarded region of the comm watchdog (kernels/comm/comm_watchdog.h), so a rank that stops
 * answering ends the job within runtime.comm_timeout_s or two, named, wherever in HDF5 the
 * others wait. */
#include <string.h>

#include "kernels/comm/comm_watchdog.h"
#include "src/ckpt/ckpt_internal.h"

/* While every rank answers, a region may last the timeout plus its bytes at
 * CKPT_SLOWEST_BYTES_S, at least CKPT_GUARD_FLOOR_S more: a big checkpoint on a slow disk
 * is not a hang, a file system that never returns is. */
#define CKPT_SLOWEST_BYTES_S 10e6
#define CKPT_GUARD_FLOOR_S 60.0
#define CKPT_LIMIT_NOTE                                                                    \
    "a checkpoint save or load may last runtime.comm_timeout_s + its size at 10 MB/s (at " \
    "least 60 s) while every rank answers"

void ckpt_guard_begin(const char *what, uint64_t bytes) {
    double more = (double)bytes / CKPT_SLOWEST_BYTES_S;
    if (more < CKPT_GUARD_FLOOR_S) more = CKPT_GUARD_FLOOR_S;
    shlm_guard_begin(what, shlm_comm_timeout_s() + more, CKPT_LIMIT_NOTE);
}

const char *ckpt_base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash && slash[1] ? slash + 1 : path;
}
