/* The one reduction at the end of a training step (over the world): the stop flags the
 * loop needs, the slowest and fastest rank's step time and compute/comm split, the
 * largest exposed comm per group and peak memory, and the GPU telemetry summary since
 * the previous logged row (min and max across GPUs). A fixed-size record of doubles
 * under a user-defined MPI operation, issued through shlm_timed_allreduce. */
#ifndef SHLM_STEP_REDUCE_H
#define SHLM_STEP_REDUCE_H

#include <mpi.h>

#include "src/watch/telemetry.h"

typedef struct step_record {
    double stop_signal;      /* max: a stop signal this rank saw (src/base/signals.h) */
    double data_failed;      /* max: this rank's token file changed */
    double comm_ms[3];       /* max: exposed comm in the shard, the replica group, both */
    double mem_peak_bytes;   /* max */
    double slow_ms, slow_rank, slow_comm_ms; /* the rank with the longest step (ties: lowest rank) */
    double fast_ms, fast_rank, fast_comm_ms; /* ... the shortest */
    /* telemetry: per field, the window mean's and max's min and max across GPUs */
    double mean_lo[TEL_N], mean_hi[TEL_N], max_lo[TEL_N], max_hi[TEL_N];
    double throttle_reasons; /* OR, as an integer below 2^53 */
    double ecc_corrected, ecc_uncorrected; /* sums (NaN where no GPU reports ECC) */
    double xid_count;        /* sum */
    double xid_last;         /* max code */
    double gpus;             /* sum: GPUs that contributed */
} step_record;

/* Creates the MPI datatype and operation (once, collective-free). */
void step_reduce_init(void);
void step_reduce_free(void);

/* This rank's record: its flags, step time, exposed comm per group, peak memory and
 * (windows of its node's GPUs, n may be 0) telemetry. */
void step_record_fill(step_record *r, int rank, double stop_signal, double data_failed,
                      double step_ms, const double comm_ms[2], double mem_peak_bytes,
                      const tel_gpu *gpus, int n);

/* The reduction, in place, over comm (every rank gets the result). */
int step_reduce(step_record *r, MPI_Comm comm);

/* The operation on two records (in into inout), for tests. */
void step_record_combine(const step_record *in, step_record *inout);

#endif
