/* The fatal-error path shared by every check macro: one line on stderr naming the
 * failure, rank and host, then MPI_Abort so no other rank is left waiting. */
#include "kernels/check.h"

#include <mpi.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

int shlm_rank(void) {
    int init = 0, fin = 0, rank = -1;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

const char *shlm_host(void) {
    static char host[256];
    if (!host[0] && gethostname(host, sizeof host - 1) != 0) strcpy(host, "?");
    return host;
}

void shlm_fatal_at(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "shardlm: error: %s (rank %d on %s, %s:%d)\n", msg, shlm_rank(),
            shlm_host(), file, line);
    fflush(stderr);
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}
