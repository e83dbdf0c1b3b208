/* Validation (run.h run_validate): every window of data.val scored once, token-weighted,
 * at any world size. */
#include "src/run/run.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "src/base/signals.h"
#include "src/run/batch.h"

int run_validate(run *r, double *loss, double *scored) {
    const job_config *c = &r->cfg;
    data_loader dl;
    char err[512];
    if (data_loader_init(&dl, &r->val_tf, c->seq_len, 0, c->seed, r->rank, r->world,
                         c->micro_batch, err, sizeof err) != 0)
        SHLM_FATAL("%s", err);
    dl.doc_mask = c->doc_mask;
    /* the same windows whatever the world size, each scored once: the whole set, or its
     * first eval_batches global batches, split over ranks like training data; every rank
     * runs the same number of forward passes, a row past the last window scoring nothing */
    const uint64_t per_batch = (uint64_t)c->micro_batch * r->world;
    uint64_t windows = c->eval_batches > 0 ? (uint64_t)c->eval_batches * c->global_batch
                                           : dl.n_windows;
    if (windows > dl.n_windows) windows = dl.n_windows;
    const uint64_t batches = (windows + per_batch - 1) / per_batch;
    batch_rows br;
    batch_rows_alloc(&br, c);
    int32_t *in = br.inputs, *tg = br.targets, *ds = br.doc_start;
    /* token-weighted: the loss sums and target counts of all ranks, divided once */
    double sums[3] = {0, 0, 0}; /* loss sum, trained targets, ranks whose token file changed */
    char data_err[1536] = "";
    int data_failed = 0;
    fsdp_begin_pass(r->engine, 0);
    int stop_sig = 0; /* a stop signal on any rank: every rank ends the pass at the same batch */
    for (uint64_t b = 0; b < batches && !stop_sig; b++) {
        if (!data_failed &&
            data_loader_batch(&dl, b * per_batch, 0, in, tg, ds, data_err, sizeof data_err) != 0)
            data_failed = 1;
        for (int j = 0; j < c->micro_batch; j++) /* row j holds sample b·per_batch + j·W + r */
            if (b * per_batch + (uint64_t)j * r->world + (uint64_t)r->rank >= windows)
                for (int t = 0; t < c->seq_len; t++) tg[(size_t)j * c->seq_len + t] = -1;
        int valid = 0;
        const model_batch mb = {in, tg, ds, c->micro_batch, c->seq_len, NULL};
        sums[0] += model_forward(r->model, &mb, &valid, NULL, NULL);
        sums[1] += valid;
        if (b + 1 < batches) { /* one small reduction beside the pass's own collectives */
            double sig = shlm_signals_pending();
            MPI_CHECK(shlm_timed_allreduce(MPI_IN_PLACE, &sig, 1, MPI_DOUBLE, MPI_MAX,
                                           MPI_COMM_WORLD));
            stop_sig = (int)sig;
        }
    }
    sums[2] = data_failed;
    MPI_CHECK(shlm_timed_allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    batch_rows_free(&br);
    data_loader_free(&dl);
    if (sums[2] > 0) return any_rank_failed(!data_failed, data_err);
    if (stop_sig) { /* a part of the set is not its loss */
        *loss = NAN;
        return stop_sig;
    }
    *loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
    if (scored) *scored = sums[1];
    return 0;
}
