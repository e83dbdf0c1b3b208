/* Per-step training metrics: the fixed-width line rank 0 prints and the JSON line
 * appended to <run_dir>/metrics.jsonl; model FLOPs for MFU. */
#ifndef SHLM_METRICS_H
#define SHLM_METRICS_H

#include <stddef.h>
#include <stdio.h>


typedef struct step_record step_record;

/* One logged step: what the line and the JSON row show (README "metrics.jsonl" lists
 * every field with its unit). */
typedef struct step_metrics {
    int step;               /* 1-based optimizer step */
    int steps;              /* train.steps: the line's "step/total" */
    double loss;            /* mean train loss of the step */
    double val_loss;        /* NaN when not evaluated this step */
    double lr;
    double grad_norm;       /* before clipping */
    double tokens_per_s;    /* whole job: tokens of the step / its time */
    double tokens_per_s_per_gpu; /* tokens_per_s / ranks */
    double tflops_per_gpu;  /* model FLOPs per second per rank */
    double mfu;             /* tflops_per_gpu / the device's dense peak; NaN = n/a */
    double step_ms;         /* the step's time: its slowest rank's */
    double comm_exposed_ms; /* the longest time a rank waited on collectives not hidden by
                             * compute (both groups) */
    double comm_ms[2];      /* ... per group: shard, replica (each its slowest rank's) */
    size_t mem_peak_bytes;  /* peak device (cpu: resident) memory of rank 0 */
    long long tokens_seen;
    long long tokens_to_go; /* tokens of the steps left to the run's last */
    double elapsed_s;       /* since this run's first step started */
    double eta_s;           /* to the run's last step, from the mean step so far */
    int skipped;            /* the loss or gradient norm was not finite: no update applied */
    /* the straggler: the slowest and fastest rank of the step and their split */
    int slowest_rank, fastest_rank;
    const char *slowest_host, *fastest_host;
    double slowest_step_ms, slowest_comm_ms, fastest_step_ms, fastest_comm_ms;
    /* identity of the row */
    double unix_time;       /* when the row was written */
    const char *run_id, *job_hash;
    const step_record *gpu; /* GPU telemetry since the previous row; NULL = none */
} step_metrics;

typedef struct metrics_log {
    FILE *jsonl;
} metrics_log;

/* Creates run_dir (and parents) and opens metrics.jsonl for appending (a link there, or
 * a file with other hard links, is refused: io/safe_file.h). */
int metrics_open(metrics_log *log, const char *run_dir, char *err, size_t errlen);
void metrics_close(metrics_log *log);
void metrics_print_header(FILE *out);
void metrics_print_step(FILE *out, const step_metrics *s);
void metrics_write_json(metrics_log *log, const step_metrics *s);

/* "1.5K", "4.2M", "1.1B", "3.0T": a count for the step line. */
void metrics_human_count(double v, char *out, size_t outlen);
/* "0:00:07", "12:34:56", "3d 04:05:06": a duration for the step line; "-" for NaN. */
void metrics_human_duration(double s, char *out, size_t outlen);

/* Peak resident set size of this process (VmHWM), in bytes; 0 if unknown. */
size_t peak_rss_bytes(void);

#endif
