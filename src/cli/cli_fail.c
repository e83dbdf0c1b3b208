/* The commands' one error line (cli_fail.h). */
#include "src/cli/cli_fail.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>

int cli_fail(const char *cmd, int status, const char *fmt, ...) {
    int mpi = 0, done = 0, rank = 0;
    MPI_Initialized(&mpi);
    if (mpi) MPI_Finalized(&done);
    if (mpi && !done) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) return status;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (cmd) fprintf(stderr, "shardlm: error: %s: %s\n", cmd, msg);
    else fprintf(stderr, "shardlm: error: %s\n", msg);
    return status;
}
