/* The closing summary of a training run: steps, tokens, mean and median step time, peak
 * memory, exposed comm, stalls and the usual straggler, printed by rank 0 and written to
 * <run_dir>/summary.json. */
#ifndef SHLM_RUN_SUMMARY_H
#define SHLM_RUN_SUMMARY_H

#include <stddef.h>
#include <stdio.h>

/* A step slower than STALL_FACTOR x the run's median step is a stall. */
#define RUN_SUMMARY_STALL_FACTOR 2.0

typedef struct run_summary {
    int first, last;          /* steps of this run: first..last (1-based) */
    double *step_ms;          /* every step's time, in order */
    double *comm_ms;          /* every step's exposed comm (slowest rank) */
    int n, cap;
    long long tokens;         /* trained by this run */
    size_t mem_peak_bytes;    /* largest over ranks */
    int *slowest_count;       /* per world rank: steps it was the slowest */
    int world;
    int skipped;
} run_summary;

void run_summary_init(run_summary *s, int world);
void run_summary_free(run_summary *s);
/* One step: its number, time, exposed comm, tokens, the largest peak memory so far,
 * its slowest rank and whether it was skipped. */
void run_summary_add(run_summary *s, int step, double step_ms, double comm_ms, long long tokens,
                     size_t mem_peak_bytes, int slowest_rank, int skipped);

typedef struct run_summary_stats {
    int steps;
    double mean_ms, median_ms, first_ms, comm_mean_ms;
    int stalls;               /* steps after the first over STALL_FACTOR x median */
    double stall_ms;          /* their time beyond the median, summed */
    int usual_slowest_rank;   /* the rank slowest most often; its share of the steps */
    double usual_slowest_share;
} run_summary_stats;

void run_summary_compute(const run_summary *s, run_summary_stats *out);

/* Prints "summary: ..." lines; hosts[r] names rank r's host. */
void run_summary_print(FILE *out, const run_summary *s, const char *run_id, double wall_s,
                       const char *const *hosts);
/* Writes <run_dir>/summary.json (replaced whole: io/safe_file.h). Returns 0 or -1 with err. */
int run_summary_write(const char *run_dir, const run_summary *s, const char *run_id,
                      const char *job_hash, double wall_s, const char *const *hosts, char *err,
                      size_t errlen);

#endif
