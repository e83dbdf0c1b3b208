/* Error-check macros: one per library. Each evaluates its call once and, on
 * failure, prints the call text, file:line, rank and host, then aborts the job. */
#ifndef SHLM_CHECK_H
#define SHLM_CHECK_H

#include <stdio.h>
#include <stdlib.h>

/* Prints "shardlm: error: <message> (rank R on HOST, file:line)" to stderr and
 * ends the whole job with MPI_Abort (an exit() on one rank can hang the others). */
void shlm_fatal_at(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
#define SHLM_FATAL(...) shlm_fatal_at(__FILE__, __LINE__, __VA_ARGS__)

/* Rank and host of this process, for messages (rank -1 before MPI_Init). */
int shlm_rank(void);
const char *shlm_host(void);

#define MPI_CHECK(call)                                                                   \
    do {                                                                                  \
        int mpi_check_rc_ = (call);                                                       \
        if (mpi_check_rc_ != 0 /* MPI_SUCCESS */) {                                       \
            char mpi_check_msg_[512];                                                     \
            int mpi_check_len_ = 0;                                                       \
            MPI_Error_string(mpi_check_rc_, mpi_check_msg_, &mpi_check_len_);             \
            SHLM_FATAL("%s failed: %s", #call, mpi_check_msg_);                           \
        }                                                                                 \
    } while (0)

#define SHLM_CHECK_ALLOC(ptr)                                                             \
    do {                                                                                  \
        if ((ptr) == NULL) SHLM_FATAL("out of host memory: %s", #ptr);                    \
    } while (0)

#endif
