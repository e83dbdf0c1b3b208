/* All ranks agree on a failure (agree.h). */
#include "src/base/agree.h"

#include <stdio.h>

#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"

/* The lowest rank of comm that failed, or the size of comm when none did; where names the
 * operation should a rank never arrive. */
static int first_failed(MPI_Comm comm, int ok, const char *where, int *rank, int *size) {
    MPI_CHECK(MPI_Comm_rank(comm, rank));
    MPI_CHECK(MPI_Comm_size(comm, size));
    int first = ok ? *size : *rank;
    MPI_CHECK(shlm_timed_allreduce_at(where, MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm));
    return first;
}

int any_rank_failed(int ok, const char *msg) {
    int rank, world;
    const int first = first_failed(MPI_COMM_WORLD, ok, __func__, &rank, &world);
    if (first == world) return 0;
    if (rank == first) {
        if (world > 1) fprintf(stderr, "shardlm: error: %s (rank %d)\n", msg, rank);
        else fprintf(stderr, "shardlm: error: %s\n", msg);
        fflush(stderr);
    }
    return -1;
}

int ranks_agree(MPI_Comm comm, int ok, char *err, size_t errlen) {
    int rank, size;
    const int first = first_failed(comm, ok, __func__, &rank, &size);
    if (first == size) return 0;
    char buf[1536];
    snprintf(buf, sizeof buf, "%s", rank == first ? err : "");
    MPI_CHECK(MPI_Bcast(buf, (int)sizeof buf, MPI_CHAR, first, comm));
    snprintf(err, errlen, "%s", buf);
    return -1;
}
