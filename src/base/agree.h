/* All ranks agree on a failure: the one rule every collective step of the program follows
 * (a rank that fails alone must not leave the others waiting in the next collective, and
 * the job reports the failure once). */
#ifndef SHLM_AGREE_H
#define SHLM_AGREE_H

#include <mpi.h>
#include <stddef.h>

/* Over MPI_COMM_WORLD: 0 when every rank passed ok == 1; otherwise the lowest failing
 * rank prints its message once as "shardlm: error: MSG (rank R)" ("(rank R)" only with
 * more than one rank) and -1 (true) is returned on every rank, so
 * `if (any_rank_failed(ok, err)) return -1;`. Collective, under the comm deadline
 * (runtime.comm_timeout_s). */
int any_rank_failed(int ok, const char *msg);

/* Over comm: 0 when every rank passed ok; else -1 on every rank with the lowest failing
 * rank's message copied into every rank's err (nothing printed: the caller reports it).
 * Collective. */
int ranks_agree(MPI_Comm comm, int ok, char *err, size_t errlen);

#endif
