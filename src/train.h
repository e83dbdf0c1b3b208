/* The training run: set-up shared by `train` and `eval` (config, backend, data,
 * engine, model), the step loop, validation and the closing sample. */
#ifndef SHLM_TRAIN_H
#define SHLM_TRAIN_H

#include <mpi.h>

#include "io/tokens.h"
#include "kernels/ops.h"
#include "src/config.h"
#include "src/data_loader.h"
#include "src/fsdp.h"
#include "src/llama.h"
#include "src/topology.h"

typedef struct run {
    job_config cfg;
    int rank, world;          /* MPI_COMM_WORLD */
    int local_rank, local_size;
    const shlm_ops *ops;
    const shlm_comm *comm;
    topology topo;
    token_file train_tf, val_tf;
    int have_val;
    fsdp_engine *engine;
    llama_model *model;
    int grad_accum;           /* micro-batches per rank per step */
} run;

/* All ranks agree on success: returns 0 if every rank passed ok == 1; otherwise the
 * lowest failing rank's message is printed once as "shardlm: error: ..." and -1 is
 * returned on every rank. */
int all_ranks_ok(int ok, const char *msg);

/* Loads the job and builds everything; returns 0 or -1 (message already printed). */
int run_setup(run *r, const char *job_path, int n_sets, char *const *sets, int need_train_data);
void run_teardown(run *r);

/* Mean loss over the validation set (or its first eval_batches micro-batches) into
 * *loss. Collective; returns 0, or -1 on every rank (message printed once) when a rank's
 * token file changed under the run. */
int run_validate(run *r, double *loss);

#endif
