/* The comm watchdog's drop-in reduction and roll call (kernels/comm/comm_watchdog.h), run on
 * several ranks by tests/hung_rank.sh, which checks what the modes below print:
 *   test_watchdog ok       shlm_timed_allreduce gives MPI_Allreduce's results (in place
 *                          and not, int MIN and double SUM); exit 0
 *   test_watchdog stop R   rank R raises SIGSTOP; the others wait in shlm_timed_allreduce
 *                          and must be ended by the watchdog naming rank R (exit 3 if it
 *                          returns)
 *   test_watchdog order    rank 0 waits in a reduction over one duplicate of the world,
 *                          the others over another: every rank is alive, none arrives;
 *                          the watchdog must end the job listing both (exit 3 if not)
 * The timeout is SHLM_TEST_COMM_TIMEOUT_S seconds (hung_rank.sh sets 3; default 600, as
 * runtime.comm_timeout_s's). A last argument beyond these is ignored (the test's tag, to
 * find leftover processes). */
#include <mpi.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "tests/check.h"

static int rank, size;

static int check_ok(void) {
    check_rank = rank;
    for (int round = 0; round < 3; round++) {
        int x = 100 - rank - round, min = -1;
        MPI_CHECK(shlm_timed_allreduce(&x, &min, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
        CHECK(min == 100 - (size - 1) - round, "round %d: int MIN %d", round, min);
        double v[2] = {rank, 1.0};
        MPI_CHECK(shlm_timed_allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
        CHECK(!(v[0] != size * (size - 1) / 2.0 || v[1] != size), "round %d: double SUM %g %g",
              round, v[0], v[1]);
    }
    const int rc = check_exit_mpi(MPI_COMM_WORLD);
    if (rank == 0) printf("test_watchdog ok: %s\n", rc ? "WRONG results" : "results as MPI_Allreduce's");
    return rc;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char err[256] = "";
    const char *t = getenv("SHLM_TEST_COMM_TIMEOUT_S");
    if (shlm_watchdog_init(MPI_COMM_WORLD, t ? atof(t) : 600, err, sizeof err) != 0) {
        fprintf(stderr, "test_watchdog: %s\n", err);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *mode = argc > 1 ? argv[1] : "ok";
    if (strcmp(mode, "ok") == 0) {
        int rc = check_ok();
        MPI_Finalize();
        return rc;
    }
    int x = 1, y = 0;
    if (strcmp(mode, "stop") == 0 && argc > 2) {
        int stop = atoi(argv[2]);
        check_ok(); /* every rank has issued the same collectives before the stop */
        if (rank == stop) raise(SIGSTOP);
        MPI_CHECK(shlm_timed_allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    } else if (strcmp(mode, "order") == 0) {
        MPI_Comm first, second;
        MPI_Comm_dup(MPI_COMM_WORLD, &first);
        MPI_Comm_dup(MPI_COMM_WORLD, &second);
        MPI_Comm_set_name(first, "first");
        MPI_Comm_set_name(second, "second");
        MPI_CHECK(shlm_timed_allreduce(&x, &y, 1, MPI_INT, MPI_SUM, rank == 0 ? first : second));
    } else {
        fprintf(stderr, "usage: test_watchdog ok | stop RANK | order\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    fprintf(stderr, "test_watchdog: %s: the reduction returned (%d) instead of ending the job\n",
            mode, y);
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
}
