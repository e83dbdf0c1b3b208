/* The step-end reduction (step_reduce.h). */
#include "src/watch/step_reduce.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"

enum { N_DOUBLES = (int)(sizeof(step_record) / sizeof(double)) };

static MPI_Datatype g_type = MPI_DATATYPE_NULL;
static MPI_Op g_op = MPI_OP_NULL;

static double max2(double a, double b) { return b > a || isnan(a) ? b : a; }
static double min2(double a, double b) { return b < a || isnan(a) ? b : a; }
/* a sum where NaN means "nobody reported": NaN + x = x */
static double nansum(double a, double b) { return isnan(a) ? b : isnan(b) ? a : a + b; }

void step_record_combine(const step_record *in, step_record *io) {
    io->stop_signal = max2(io->stop_signal, in->stop_signal);
    io->data_failed = max2(io->data_failed, in->data_failed);
    for (int g = 0; g < 3; g++) io->comm_ms[g] = max2(io->comm_ms[g], in->comm_ms[g]);
    io->mem_peak_bytes = max2(io->mem_peak_bytes, in->mem_peak_bytes);
    /* ties go to the lower rank, so the operation is commutative */
    if (in->slow_ms > io->slow_ms || (in->slow_ms == io->slow_ms && in->slow_rank < io->slow_rank)) {
        io->slow_ms = in->slow_ms;
        io->slow_rank = in->slow_rank;
        io->slow_comm_ms = in->slow_comm_ms;
    }
    if (in->fast_ms < io->fast_ms || (in->fast_ms == io->fast_ms && in->fast_rank < io->fast_rank)) {
        io->fast_ms = in->fast_ms;
        io->fast_rank = in->fast_rank;
        io->fast_comm_ms = in->fast_comm_ms;
    }
    for (int f = 0; f < TEL_N; f++) {
        io->mean_lo[f] = min2(io->mean_lo[f], in->mean_lo[f]);
        io->mean_hi[f] = max2(io->mean_hi[f], in->mean_hi[f]);
        io->max_lo[f] = min2(io->max_lo[f], in->max_lo[f]);
        io->max_hi[f] = max2(io->max_hi[f], in->max_hi[f]);
    }
    io->throttle_reasons = (double)((uint64_t)io->throttle_reasons | (uint64_t)in->throttle_reasons);
    io->ecc_corrected = nansum(io->ecc_corrected, in->ecc_corrected);
    io->ecc_uncorrected = nansum(io->ecc_uncorrected, in->ecc_uncorrected);
    io->xid_count += in->xid_count;
    io->xid_last = max2(io->xid_last, in->xid_last);
    io->gpus += in->gpus;
}

static void combine_op(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const step_record *a = in;
    step_record *b = inout;
    for (int i = 0; i < *len; i++) step_record_combine(&a[i], &b[i]);
}

void step_reduce_init(void) {
    if (g_op != MPI_OP_NULL) return;
    MPI_CHECK(MPI_Type_contiguous(N_DOUBLES, MPI_DOUBLE, &g_type));
    MPI_CHECK(MPI_Type_commit(&g_type));
    MPI_CHECK(MPI_Op_create(combine_op, 1, &g_op));
}

void step_reduce_free(void) {
    if (g_op == MPI_OP_NULL) return;
    MPI_CHECK(MPI_Op_free(&g_op));
    MPI_CHECK(MPI_Type_free(&g_type));
}

void step_record_fill(step_record *r, int rank, double stop_signal, double data_failed,
                      double step_ms, const double comm_ms[2], double mem_peak_bytes,
                      const tel_gpu *gpus, int n) {
    memset(r, 0, sizeof *r);
    r->stop_signal = stop_signal;
    r->data_failed = data_failed;
    r->comm_ms[0] = comm_ms[0];
    r->comm_ms[1] = comm_ms[1];
    r->comm_ms[2] = comm_ms[0] + comm_ms[1];
    r->mem_peak_bytes = mem_peak_bytes;
    r->slow_ms = r->fast_ms = step_ms;
    r->slow_rank = r->fast_rank = rank;
    r->slow_comm_ms = r->fast_comm_ms = comm_ms[0] + comm_ms[1];
    for (int f = 0; f < TEL_N; f++) r->mean_lo[f] = r->mean_hi[f] = r->max_lo[f] = r->max_hi[f] = NAN;
    r->ecc_corrected = r->ecc_uncorrected = NAN;
    for (int i = 0; i < n; i++) {
        const tel_gpu *g = &gpus[i];
        for (int f = 0; f < TEL_N; f++) {
            r->mean_lo[f] = min2(r->mean_lo[f], g->mean[f]);
            r->mean_hi[f] = max2(r->mean_hi[f], g->mean[f]);
            r->max_lo[f] = min2(r->max_lo[f], g->max[f]);
            r->max_hi[f] = max2(r->max_hi[f], g->max[f]);
        }
        r->throttle_reasons = (double)((uint64_t)r->throttle_reasons | g->throttle_reasons);
        r->ecc_corrected = nansum(r->ecc_corrected, g->ecc_corrected);
        r->ecc_uncorrected = nansum(r->ecc_uncorrected, g->ecc_uncorrected);
        r->xid_count += (double)g->xid_count;
        r->xid_last = max2(r->xid_last, (double)g->xid_last);
    }
    r->gpus = n;
}

int step_reduce(step_record *r, MPI_Comm comm) {
    return shlm_timed_allreduce(MPI_IN_PLACE, r, 1, g_type, g_op, comm);
}
