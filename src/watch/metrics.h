/* Per-step training metrics: the fixed-width line rank 0 prints, the JSON line appended
 * to <run_dir>/metrics.jsonl and the same numbers as TensorBoard scalars
 * (log.tensorboard); model FLOPs for MFU. */
#ifndef SHLM_METRICS_H
#define SHLM_METRICS_H

#include <stddef.h>
#include <stdio.h>

#include "io/tfevents.h"
#include "src/watch/telemetry.h"

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
    /* a data.train mixture: tokens taken from each source so far (resumed steps
     * included), under its name; n_sources 0 for one file */
    int n_sources;
    const char *const *source_names;
    const long long *source_tokens;
} step_metrics;

/* One logged step as metrics.jsonl's row and as TensorBoard scalars, both made by
 * metrics_row_build: the one place that names a row's fields, their JSON formats and
 * their tags. A scalar's value is its JSON text read back, so the two agree by
 * construction (TensorBoard keeps a float: the JSON value rounded to float32). */
enum { METRICS_ROW_TEXT = 32768, METRICS_ROW_SCALARS = 80, METRICS_ROW_SOURCES = 16,
       METRICS_SOURCE_TAG = 320 };
typedef struct metrics_row {
    char json[METRICS_ROW_TEXT];  /* the line, ending in '\n' */
    size_t len;
    /* the row's finite numbers that have a tag, in the row's order (a null is no scalar) */
    tfevents_scalar scalars[METRICS_ROW_SCALARS];
    int n_scalars;
    char gpu_tags[2 * TEL_N][48]; /* the telemetry's tags, gpu/<field>/mean_lo and _hi */
    char source_tags[METRICS_ROW_SOURCES][METRICS_SOURCE_TAG]; /* data/tokens_seen/<name> */
} metrics_row;

/* The row of s. Its fields and their tags (README "Watching a run" lists them):
 * train/loss, train/lr, train/grad_norm, train/tokens_seen, val/loss;
 * perf/tokens_per_s, perf/tokens_per_s_per_gpu, perf/tflops_per_gpu, perf/mfu,
 * perf/step_ms, perf/comm_exposed_ms, perf/comm_shard_ms, perf/comm_replica_ms;
 * mem/peak_bytes; progress/elapsed_s, progress/eta_s, progress/tokens_to_go;
 * data/tokens_seen/<source> per source of a mixture (JSON: tokens_seen_by_source);
 * straggler/{slowest,fastest}_{rank,step_ms,comm_ms,compute_ms}; and, with telemetry,
 * gpu/<field>/mean_lo and mean_hi, the window mean of the GPU lowest and highest in it.
 * The step, train.steps, the strings and the rest of the telemetry are JSON only. */
void metrics_row_build(const step_metrics *s, metrics_row *row);

/* Rank 0's logs of the steps: metrics.jsonl, and the TensorBoard event file when
 * log.tensorboard is set. */
typedef struct metrics_log {
    FILE *jsonl;
    tfevents_file tb;       /* tb.fp is NULL when off, or after a write failed */
} metrics_log;

/* Creates run_dir (and parents) and opens metrics.jsonl for appending (a link there, or
 * a file with other hard links, is refused: io/safe_file.h). */
int metrics_open(metrics_log *log, const char *run_dir, char *err, size_t errlen);
/* log.tensorboard = setting (not empty): the directory, auto meaning <run_dir>/tb, into
 * dir; creates it and a new event file there (io/tfevents.h), or returns -1 with one
 * line in err naming the key. */
int metrics_open_tensorboard(metrics_log *log, const char *setting, const char *run_dir,
                             const char *host, double wall_time, char *dir, size_t dirlen,
                             char *err, size_t errlen);
/* The events before a run's first step, which trains step first+1: text (the resolved
 * job) at step first, and TensorBoard's restart marker at step first+1, so a reader
 * drops what earlier files in the directory hold from there on (a resumed run's steps
 * replace those that a stopped run logged after its checkpoint). No-op without an
 * event file. */
void metrics_begin_tensorboard(metrics_log *log, int first, double wall_time,
                               const char *job_text);
void metrics_close(metrics_log *log);
void metrics_print_header(FILE *out);
void metrics_print_step(FILE *out, const step_metrics *s);
/* The row of s to metrics.jsonl and, as one event at step s->step and wall time
 * s->unix_time, to the event file; both flushed. A failed event write warns once and
 * ends the TensorBoard log; training goes on. */
void metrics_write(metrics_log *log, const step_metrics *s);

/* "1.5K", "4.2M", "1.1B", "3.0T": a count for the step line. */
void metrics_human_count(double v, char *out, size_t outlen);
/* "0:00:07", "12:34:56", "3d 04:05:06": a duration for the step line; "-" for NaN. */
void metrics_human_duration(double s, char *out, size_t outlen);

/* Peak resident set size of this process (VmHWM), in bytes; 0 if unknown. */
size_t peak_rss_bytes(void);

#endif
