/* The failure counting of the C tests, one copy. Every check counts into n_checks and, when
 * it fails, n_failed; main() ends with `return check_exit();`, which prints
 * "# N checks, M failed" and turns the counts into the exit status (0, or 1 when any
 * failed). Lines go to stdout, flushed, so that they keep their order with the test's own.
 *   check(ok, fmt, ...)    a check with its line either way: "ok   - what" or "FAIL - what";
 *                          returns ok
 *   CHECK(cond, fmt, ...)  a check printed only when it fails (checks in loops):
 *                          "FAIL [rank R ]file:line: cond: what"; returns whether it held
 *   CHECK_EQ(a, b)         CHECK that two integers are equal, naming both values
 *   check_skip(fmt, ...)   the test cannot run here: prints "SKIP: why" and returns 77,
 *                          automake's skip status, for main() to return
 * An MPI test (mpi.h included before this file) sets check_rank to its rank, which the
 * failure lines then name, and ends with check_exit_mpi(comm): the counts summed over
 * comm's ranks, printed by its rank 0, the same status on every rank. */
#ifndef SHLM_TESTS_CHECK_H
#define SHLM_TESTS_CHECK_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

static int n_checks, n_failed;
static int check_rank = -1; /* an MPI test's rank, named in failure lines; -1: none */

static int check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3), unused));
static int check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s - ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    n_checks++;
    n_failed += !ok;
    return ok;
}

static int check_at(int ok, const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 5, 6), unused));
static int check_at(int ok, const char *file, int line, const char *cond, const char *fmt, ...) {
    n_checks++;
    if (ok) return 1;
    n_failed++;
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    if (check_rank >= 0) printf("rank %d ", check_rank);
    printf("%s:%d: %s: ", file, line, cond);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    return 0;
}

#define CHECK(cond, ...) check_at(!!(cond), __FILE__, __LINE__, #cond, __VA_ARGS__)

#define CHECK_EQ(a, b)                                                                      \
    do {                                                                                    \
        const uintmax_t check_a_ = (uintmax_t)(a), check_b_ = (uintmax_t)(b);               \
        check_at(check_a_ == check_b_, __FILE__, __LINE__, #a " == " #b,                    \
                 "%s = %ju, expected %s = %ju", #a, check_a_, #b, check_b_);                \
    } while (0)

static int check_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static int check_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("SKIP: ");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    return 77;
}

static int check_exit(void) __attribute__((unused));
static int check_exit(void) {
    printf("# %d checks, %d failed\n", n_checks, n_failed);
    fflush(stdout);
    return n_failed ? 1 : 0;
}

#ifdef MPI_VERSION
static int check_exit_mpi(MPI_Comm comm) __attribute__((unused));
static int check_exit_mpi(MPI_Comm comm) {
    int counts[2] = {n_checks, n_failed}, rank;
    MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_SUM, comm);
    MPI_Comm_rank(comm, &rank);
    if (rank == 0) printf("# %d checks, %d failed\n", counts[0], counts[1]);
    fflush(stdout);
    return counts[1] ? 1 : 0;
}
#endif

#endif
