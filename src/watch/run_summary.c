/* The closing summary (run_summary.h). */
#include "src/watch/run_summary.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/safe_file.h"
#include "kernels/check.h"
#include "src/base/startup.h"

void run_summary_init(run_summary *s, int world) {
    memset(s, 0, sizeof *s);
    s->world = world;
    s->slowest_count = calloc((size_t)(world > 0 ? world : 1), sizeof(int));
    SHLM_CHECK_ALLOC(s->slowest_count);
}

void run_summary_free(run_summary *s) {
    free(s->step_ms);
    free(s->comm_ms);
    free(s->slowest_count);
    memset(s, 0, sizeof *s);
}

void run_summary_add(run_summary *s, int step, double step_ms, double comm_ms, long long tokens,
                     size_t mem_peak_bytes, int slowest_rank, int skipped) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->step_ms = realloc(s->step_ms, (size_t)s->cap * sizeof(double));
        s->comm_ms = realloc(s->comm_ms, (size_t)s->cap * sizeof(double));
        SHLM_CHECK_ALLOC(s->step_ms);
        SHLM_CHECK_ALLOC(s->comm_ms);
    }
    if (s->n == 0) s->first = step;
    s->last = step;
    s->step_ms[s->n] = step_ms;
    s->comm_ms[s->n] = comm_ms;
    s->n++;
    s->tokens += tokens;
    if (mem_peak_bytes > s->mem_peak_bytes) s->mem_peak_bytes = mem_peak_bytes;
    if (slowest_rank >= 0 && slowest_rank < s->world) s->slowest_count[slowest_rank]++;
    s->skipped += skipped;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void run_summary_compute(const run_summary *s, run_summary_stats *o) {
    memset(o, 0, sizeof *o);
    o->steps = s->n;
    o->usual_slowest_rank = -1;
    if (s->n == 0) return;
    double *sorted = malloc((size_t)s->n * sizeof(double));
    SHLM_CHECK_ALLOC(sorted);
    double sum = 0, comm = 0;
    for (int i = 0; i < s->n; i++) sum += s->step_ms[i], comm += s->comm_ms[i];
    memcpy(sorted, s->step_ms, (size_t)s->n * sizeof(double));
    qsort(sorted, (size_t)s->n, sizeof(double), cmp_double);
    o->median_ms = s->n % 2 ? sorted[s->n / 2] : 0.5 * (sorted[s->n / 2 - 1] + sorted[s->n / 2]);
    free(sorted);
    o->mean_ms = sum / s->n;
    o->comm_mean_ms = comm / s->n;
    o->first_ms = s->step_ms[0];
    /* the run's first step warms caches and plans: not a stall */
    for (int i = 1; i < s->n; i++)
        if (s->step_ms[i] > RUN_SUMMARY_STALL_FACTOR * o->median_ms) {
            o->stalls++;
            o->stall_ms += s->step_ms[i] - o->median_ms;
        }
    int best = 0;
    for (int r = 1; r < s->world; r++)
        if (s->slowest_count[r] > s->slowest_count[best]) best = r;
    o->usual_slowest_rank = best;
    o->usual_slowest_share = (double)s->slowest_count[best] / s->n;
}

void run_summary_print(FILE *out, const run_summary *s, const char *run_id, double wall_s,
                       const char *const *hosts) {
    run_summary_stats st;
    run_summary_compute(s, &st);
    if (st.steps == 0) {
        fprintf(out, "summary: run %s: no step trained\n", run_id);
        fflush(out);
        return;
    }
    fprintf(out, "summary: run %s: %d step(s) (%d..%d) in %.1f s, %lld tokens%s\n", run_id,
            st.steps, s->first, s->last, wall_s, s->tokens,
            s->skipped ? ", some skipped (not finite)" : "");
    fprintf(out, "summary: step time mean %.1f ms, median %.1f ms (first %.1f ms); exposed comm "
            "%.1f ms per step (%.1f%% of the mean step); peak memory %.1f MiB (largest rank)\n",
            st.mean_ms, st.median_ms, st.first_ms, st.comm_mean_ms,
            st.mean_ms > 0 ? 100 * st.comm_mean_ms / st.mean_ms : 0.0,
            s->mem_peak_bytes / 1048576.0);
    fprintf(out, "summary: stalls (steps over %.0fx the median, the first not counted): %d, "
            "%.1f s beyond the median; slowest rank most often: %d (%s), %.0f%% of the steps\n",
            RUN_SUMMARY_STALL_FACTOR, st.stalls, st.stall_ms / 1000, st.usual_slowest_rank,
            hosts ? hosts[st.usual_slowest_rank] : "?", 100 * st.usual_slowest_share);
    fflush(out);
}

int run_summary_write(const char *run_dir, const run_summary *s, const char *run_id,
                      const char *job_hash, double wall_s, const char *const *hosts, char *err,
                      size_t errlen) {
    run_summary_stats st;
    run_summary_compute(s, &st);
    char path[SAFE_FILE_PATH_MAX];
    if (snprintf(path, sizeof path, "%s/summary.json", run_dir) >= (int)sizeof path) {
        snprintf(err, errlen, "%.200s/summary.json: path too long", run_dir);
        return -1;
    }
    safe_file f;
    if (safe_file_begin(&f, path, err, errlen) != 0) return -1;
    fprintf(f.fp, "{\"run_id\": \"%s\", \"job_hash\": \"%s\", \"steps\": %d, \"first_step\": %d, "
            "\"last_step\": %d, \"tokens\": %lld, \"wall_s\": %.3f, \"step_ms_mean\": %.3f, "
            "\"step_ms_median\": %.3f, \"step_ms_first\": %.3f, \"comm_exposed_ms_mean\": %.3f, "
            "\"mem_peak_bytes\": %zu, \"stalls\": %d, \"stall_ms\": %.3f, "
            "\"stall_factor\": %.1f, \"skipped\": %d, \"usual_slowest_rank\": %d, "
            "\"usual_slowest_host\": \"%s\", \"usual_slowest_share\": %.4f, \"startup_s\": {",
            run_id, job_hash, st.steps, s->first, s->last, s->tokens, wall_s, st.mean_ms,
            st.median_ms, st.first_ms, st.comm_mean_ms, s->mem_peak_bytes, st.stalls, st.stall_ms,
            RUN_SUMMARY_STALL_FACTOR, s->skipped, st.usual_slowest_rank,
            hosts && st.usual_slowest_rank >= 0 ? hosts[st.usual_slowest_rank] : "",
            st.usual_slowest_share);
    for (int p = 0; p < STARTUP_N; p++)
        fprintf(f.fp, "%s\"%s\": %.3f", p ? ", " : "", startup_phase_key((startup_phase)p),
                startup_seconds((startup_phase)p));
    fprintf(f.fp, "}}\n");
    return safe_file_finish(&f, err, errlen);
}
