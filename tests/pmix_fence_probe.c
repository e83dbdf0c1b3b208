/* The two PMIx fences Open MPI's MPI_Init makes under a PMIx launcher (srun --mpi=pmix): the
 * modex (collecting data), then a fence without data that MPI_Init takes as a barrier, so
 * that no rank sends an MPI message to one still in MPI_Init. Rank 0 comes to the second
 * one SHLM_PROBE_DELAY seconds late (default 2); every rank prints, in CLOCK_REALTIME
 * seconds,
 *   pmix_fence_probe: rank R entered E left L
 * and a barrier that holds has no rank leaving before rank 0 entered (tests/nodes_slurm.sh
 * runs it in place of shardlm through slurm/train.sbatch; it ignores its arguments). Exit
 * status 0, or 1 with a line on stderr when a PMIx call fails. */
#include <pmix.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int failed(const char *what, pmix_status_t rc) {
    fprintf(stderr, "pmix_fence_probe: %s: %s\n", what, PMIx_Error_string(rc));
    return 1;
}

/* PMIx_Fence over every rank of this job, collecting data or not. */
static pmix_status_t fence_all(const pmix_proc_t *me, bool collect) {
    pmix_proc_t all;
    PMIX_LOAD_PROCID(&all, me->nspace, PMIX_RANK_WILDCARD);
    pmix_info_t info;
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    pmix_status_t rc = PMIx_Fence(&all, 1, &info, 1);
    PMIX_INFO_DESTRUCT(&info);
    return rc;
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    pmix_proc_t me;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) return failed("PMIx_Init", rc);
    /* something to collect, as the modex has */
    char card[64];
    snprintf(card, sizeof card, "rank %u", me.rank);
    pmix_value_t v = {.type = PMIX_STRING, .data.string = card};
    if ((rc = PMIx_Put(PMIX_GLOBAL, "pmix_fence_probe.card", &v)) != PMIX_SUCCESS)
        return failed("PMIx_Put", rc);
    if ((rc = PMIx_Commit()) != PMIX_SUCCESS) return failed("PMIx_Commit", rc);
    if ((rc = fence_all(&me, true)) != PMIX_SUCCESS) return failed("the fence with data", rc);
    const char *d = getenv("SHLM_PROBE_DELAY");
    const double delay = d ? atof(d) : 2.0;
    if (me.rank == 0 && delay > 0) {
        struct timespec ts = {.tv_sec = (time_t)delay,
                              .tv_nsec = (long)((delay - (double)(time_t)delay) * 1e9)};
        nanosleep(&ts, NULL);
    }
    const double entered = now_s();
    if ((rc = fence_all(&me, false)) != PMIX_SUCCESS)
        return failed("the fence without data", rc);
    printf("pmix_fence_probe: rank %u entered %.6f left %.6f\n", me.rank, entered, now_s());
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
