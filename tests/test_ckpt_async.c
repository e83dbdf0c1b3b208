/* checkpoint.async's fall-back to synchronous saves (src/ckpt/async.c
 * checkpoint_async_open), on 2 ranks of a small engine; tests/ckpt_async.sh runs it and
 * checks the lines rank 0 prints:
 *   test_ckpt_async memory   the staging against the host memory given: one byte short
 *                            on rank 1 only, and a host that refuses the staging on rank 1
 *                            only (its host_alloc returns NULL): -1 on every rank, no
 *                            writer (rank 0 says why, saving synchronously); exactly the
 *                            staging's bytes: 0, a writer
 *   test_ckpt_async thread   MPI initialised with MPI_THREAD_FUNNELED: -1 on every rank */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "kernels/comm.h"
#include "kernels/ops.h"
#include "src/ckpt/checkpoint.h"
#include "src/engine/fsdp.h"
#include "src/engine/topology.h"
#include "src/families/families.h"
#include "src/job/config.h"
#include "src/model/decoder.h"
#include "tests/check.h"

static int rank;

/* a host that refuses every page-locked allocation on rank 1 */
static void *refusing_alloc(size_t bytes) { return rank == 1 ? NULL : malloc(bytes); }
static void refusing_free(void *p) { free(p); }

/* opens the writer with ops and this rank's host_avail; returns the rank's result, the
 * writer (if any) closed again */
static int try_open(const shlm_ops *ops, fsdp_engine *e, const topology *topo,
                    const job_config *jc, double avail, const char *label) {
    ckpt_async *a = (ckpt_async *)&a; /* not NULL: open must set it */
    const int rc = checkpoint_async_open(&a, ops, e, topo, jc, NULL, avail, "the test's bound");
    CHECK((rc == 0) == (a != NULL), "%s: open returned %d with writer %p", label, rc, (void *)a);
    if (a) checkpoint_async_close(a);
    return rc;
}

int main(int argc, char **argv) {
    const int thread_case = argc > 1 && strcmp(argv[1], "thread") == 0;
    if (argc != 2 || (!thread_case && strcmp(argv[1], "memory") != 0)) {
        fprintf(stderr, "usage: test_ckpt_async memory|thread\n");
        return 99;
    }
    int provided = 0;
    MPI_Init_thread(&argc, &argv, thread_case ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE,
                    &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    check_rank = rank;
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 2) {
        if (rank == 0) fprintf(stderr, "test_ckpt_async: run it on 2 ranks\n");
        MPI_Finalize();
        return 99;
    }
    char err[1536] = "";
    topology topo;
    topology_options topt = {.strategy = FSDP_FULL_SHARD};
    CHECK(topology_create(&topo, MPI_COMM_WORLD, &topt, err, sizeof err) == 0, "%s", err);
    job_config jc;
    memset(&jc, 0, sizeof jc);
    family_shape_defaults(family_named("llama"), &jc.model);
    decoder_config *dc = model_shape_data(&jc.model);
    dc->dim = 64, dc->n_layers = 2, dc->n_heads = 4, dc->n_kv_heads = 2, dc->head_dim = 16;
    dc->ffn_dim = 96, dc->vocab_size = 256, dc->max_seq_len = 32;
    jc.text = "[test] test_ckpt_async";
    model_desc md;
    model_shape_desc_open(&md, &jc.model);
    shard_plan plan;
    shard_plan_build(&plan, &md, &(plan_params){.strategy = topo.strategy, .S = topo.shard_size,
                                                .R = topo.replica_size, .B = 1, .T = 32});
    fsdp_options opt = {.prefetch = 1};
    fsdp_engine *e = fsdp_create(&md, &plan, &shlm_ops_cpu, &shlm_comm_mpi, &topo, &opt, 7);
    const double need = (double)checkpoint_async_staging_bytes(e);
    CHECK(need > 0, "no staging bytes");

    if (thread_case) {
        CHECK(provided != MPI_THREAD_MULTIPLE, "MPI gave MPI_THREAD_MULTIPLE unasked");
        int rc = try_open(&shlm_ops_cpu, e, &topo, &jc, -1, "thread");
        check(rc == -1, "rank %d: MPI_THREAD_FUNNELED: no writer, saved synchronously", rank);
    } else {
        CHECK(provided == MPI_THREAD_MULTIPLE, "MPI gives no MPI_THREAD_MULTIPLE");
        int rc = try_open(&shlm_ops_cpu, e, &topo, &jc, rank == 1 ? need - 1 : 2 * need,
                          "short");
        check(rc == -1, "rank %d: rank 1's host one byte short of the staging: no writer", rank);
        shlm_ops refusing = shlm_ops_cpu;
        refusing.host_alloc = refusing_alloc;
        refusing.host_free = refusing_free;
        rc = try_open(&refusing, e, &topo, &jc, -1, "refused");
        check(rc == -1, "rank %d: rank 1's host refuses the staging: no writer", rank);
        rc = try_open(&shlm_ops_cpu, e, &topo, &jc, need, "exact");
        check(rc == 0, "rank %d: a host that holds exactly the staging: a writer", rank);
    }
    fsdp_destroy(e);
    shard_plan_free(&plan);
    model_desc_close(&md);
    topology_free(&topo);
    const int status = check_exit_mpi(MPI_COMM_WORLD);
    MPI_Finalize();
    return status;
}
