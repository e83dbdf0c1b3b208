/* Watching a training run: everything a person or a monitoring system sees of it, behind
 * four calls the training loop makes. The step line, metrics.jsonl and the TensorBoard
 * event file (rank 0: src/watch/metrics.h), the run's
 * identity (run id, job hash, UTC time on every row), progress (step/total, elapsed,
 * ETA, tokens), MFU against the device table, the step-end reduction with the straggler
 * (src/watch/step_reduce.h), GPU telemetry (src/watch/telemetry.h) and the Prometheus exporter
 * (src/watch/prometheus.h) on each node's local rank 0, the start-up breakdown and the closing
 * summary (src/watch/run_summary.h). docs/watch.md "Watching a run". */
#ifndef SHLM_WATCH_H
#define SHLM_WATCH_H

#include "src/watch/metrics.h"
#include "src/watch/step_reduce.h"
#include "kernels/ops.h"
#include "src/job/config.h"

typedef struct watch watch;

/* What watching needs of a run (kept by value; cfg and ops outlive the watch). */
typedef struct watch_run {
    const job_config *cfg;
    const shlm_ops *ops;
    int rank, world;             /* MPI_COMM_WORLD */
} watch_run;

/* Collective, before the weights are read: opens metrics.jsonl, the TensorBoard event
 * file, the exporter and the telemetry, and prints what it opened (rank 0). A
 * log.tensorboard directory that cannot be made or written, a bad log.prometheus or
 * log.prometheus_textfile, or a port in use, is one error line and -1 on every rank (*w
 * is then still to be closed); telemetry or an unknown device only warns. */
int watch_open(watch **w, const watch_run *r);
/* The run trains steps first+1..end (known once the checkpoint is read); rank 0 writes
 * the job's text at step first and the restart marker to the event file. */
void watch_set_range(watch *w, int first, int end);

/* Collective, every step: the step-end reduction of this rank's stop flags, step time,
 * exposed comm per group and peak memory, with the node's telemetry. */
void watch_step_end(watch *w, double stop_signal, double data_failed, double step_s,
                    const double comm_ms[2], size_t mem_peak_bytes, step_record *out);

/* Local, every step, after the step's decisions: sm holds step, loss, val_loss, lr,
 * grad_norm, tokens_seen, mem_peak_bytes and skipped; the rest is filled in from rec.
 * Publishes to the exporter, records the step for the summary and, when logged, prints
 * the line and writes the row (rank 0) and starts a new telemetry window. */
void watch_step(watch *w, step_metrics *sm, const step_record *rec, int logged);

/* Rank 0 prints the closing summary and writes summary.json (when print). */
void watch_summary(watch *w, int print);
/* Closes everything (NULL is fine). */
void watch_close(watch *w);

#endif
