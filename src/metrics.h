/* Per-step training metrics: the fixed-width line rank 0 prints and the JSON line
 * appended to <run_dir>/metrics.jsonl; model FLOPs for MFU. */
#ifndef SHLM_METRICS_H
#define SHLM_METRICS_H

#include <stddef.h>
#include <stdio.h>

#include "src/llama.h"

/* Dense bf16 peak of an H100/H200 SXM, the MFU denominator (DESIGN.md). */
#define SHLM_PEAK_TFLOPS 989.0

typedef struct step_metrics {
    int step;               /* 1-based optimizer step */
    double loss;            /* mean train loss of the step */
    double val_loss;        /* NaN when not evaluated this step */
    double lr;
    double grad_norm;       /* before clipping */
    double tokens_per_s;    /* whole job */
    double tflops_per_gpu;  /* model FLOPs per second per rank */
    double mfu;             /* tflops_per_gpu / SHLM_PEAK_TFLOPS */
    double step_ms;
    double comm_exposed_ms; /* time waiting on collectives not hidden by compute */
    size_t mem_peak_bytes;  /* peak resident memory of this rank */
    long long tokens_seen;
    int skipped;            /* the loss or gradient norm was not finite: no update applied */
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

/* Model FLOPs per token, 6·P + 12·L·d·T (recomputation not counted). */
double model_flops_per_token(const llama_config *c, int T);

/* Peak resident set size of this process (VmHWM), in bytes; 0 if unknown. */
size_t peak_rss_bytes(void);

#endif
