/* `shardlm train` and `shardlm eval`: their command lines, then the run (src/run/run.h):
 * set-up, the watch and checkpoint.dir before any weight is read, the loop or one
 * validation pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "src/base/signals.h"
#include "src/base/startup.h"
#include "src/cli/commands.h"
#include "src/run/run.h"
#include "src/watch/watch.h"

static const char train_usage[] =
    "usage: shardlm train JOB.ini [--set section.key=value ...]\n"
    "  Trains the job on every rank of the MPI job (mpirun -np N shardlm train ...):\n"
    "  model.init_from (a Hugging Face directory or a checkpoint) or the seed's init, or\n"
    "  checkpoint.resume (auto: checkpoint.dir's latest). `shardlm keys` lists every job\n"
    "  key; --set overrides one. Without checkpoint.dir the trained weights are not kept.\n";
static const char eval_usage[] =
    "usage: shardlm eval JOB.ini [--ckpt CKPT] [--set section.key=value ...]\n"
    "  Mean loss and perplexity over [data] val (masked targets are not scored), and the\n"
    "  number of tokens scored. Weights: --ckpt (a step_<N>.h5 file, a checkpoint\n"
    "  directory, or a Hugging Face directory), else checkpoint.resume (auto: checkpoint.dir's\n"
    "  latest), else model.init_from, else the seed's initialisation (said so). No [train]\n"
    "  schedule keys are needed; train.seq_len defaults to model.max_seq_len, or the whole\n"
    "  validation file as one window when it is shorter.\n";

/* Splits "JOB.ini [--ckpt CKPT] [--set section.key=value ...]" (--ckpt only where ckpt is
 * not NULL); returns 0, 1 for --help, or -1 with err. */
static int parse_job_args(int argc, char **argv, const char **job, const char **ckpt,
                          int *n_sets, char ***sets, char *err, size_t errlen) {
    *job = NULL;
    *n_sets = 0;
    *sets = calloc((size_t)argc + 1, sizeof(char *));
    SHLM_CHECK_ALLOC(*sets);
    const char *usage = ckpt ? "JOB.ini [--ckpt CKPT] [--set section.key=value ...]"
                             : "JOB.ini [--set section.key=value ...]";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
        if (strcmp(argv[i], "--set") == 0 || (ckpt && strcmp(argv[i], "--ckpt") == 0)) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "%s needs an argument (usage: shardlm %s %s)", argv[i],
                         argv[0], usage);
                return -1;
            }
            if (argv[i][2] == 'c') *ckpt = argv[++i];
            else (*sets)[(*n_sets)++] = argv[++i];
        } else if (strncmp(argv[i], "--set=", 6) == 0) {
            (*sets)[(*n_sets)++] = argv[i] + 6;
        } else if (argv[i][0] == '-') {
            snprintf(err, errlen, "unknown option '%s' (usage: shardlm %s %s)", argv[i],
                     argv[0], usage);
            return -1;
        } else if (*job) {
            snprintf(err, errlen, "more than one job file given ('%s' and '%s')", *job, argv[i]);
            return -1;
        } else {
            *job = argv[i];
        }
    }
    if (!*job) {
        snprintf(err, errlen, "no job file given (usage: shardlm %s %s)", argv[0], usage);
        return -1;
    }
    return 0;
}

static int job_command(int argc, char **argv, int training) {
    /* SIGUSR1/SIGTERM: train finishes its step, saves and exits 0 (src/base/signals.h);
     * installed before MPI_Init by the CLI, again here for other callers (idempotent);
     * eval keeps the default action */
    if (training) shlm_signals_install();
    const char *job, *ckpt = NULL;
    int n_sets;
    char **sets;
    char err[1536] = "";
    int parsed = parse_job_args(argc, argv, &job, training ? NULL : &ckpt, &n_sets, &sets, err,
                                sizeof err);
    if (parsed == 1) {
        if (shlm_rank() <= 0) fputs(training ? train_usage : eval_usage, stdout);
        free(sets);
        return 0;
    }
    if (any_rank_failed(parsed == 0, err)) {
        free(sets);
        return 2;
    }
    run r;
    if (run_setup(&r, job, n_sets, sets, training) != 0) {
        free(sets);
        return 1;
    }
    free(sets);
    int rc = 0, lock_fd = -1;
    ckpt_state st;
    char what[2100];
    if (training && r.rank == 0 && !r.cfg.ckpt_dir[0])
        printf("note: checkpoint.dir is not set: the weights this run trains will not be kept "
               "(set checkpoint.dir to save them)\n");
    /* the step line, metrics.jsonl, Prometheus, telemetry, the summary: a bad log.* key is
     * refused before any weight is read */
    watch *w = NULL;
    const watch_run wr = {.cfg = &r.cfg, .ops = r.ops, .rank = r.rank, .world = r.world};
    if (training && watch_open(&w, &wr) != 0) {
        rc = 1;
    } else if (training &&
               checkpoint_dir_open(r.engine, &r.topo, &r.cfg, &r.hf, &lock_fd, err, sizeof err) != 0) {
        /* checkpoint.dir problems (lock, links, writability, space) before step 1 */
        any_rank_failed(0, err);
        rc = 1;
    } else if (training) {
        rc = run_load_initial(&r, &st) != 0 ? 1 : run_train(&r, &st, w) == 0 ? 0 : 1;
        if (rc == 0 && r.rank == 0 && !r.cfg.ckpt_dir[0])
            printf("note: the trained weights were not kept: checkpoint.dir is not set\n");
    } else if (!r.have_val) {
        snprintf(err, sizeof err, "%s: eval needs [data] val", r.cfg.path);
        rc = any_rank_failed(0, err) ? 1 : 0;
    } else if (run_load_weights(&r, ckpt, what, sizeof what) != 0) {
        rc = 1;
    } else {
        double loss = NAN, scored = 0;
        if (r.rank == 0) startup_print(stdout, "the evaluation");
        if (run_validate(&r, &loss, &scored) != 0) rc = 1;
        else if (r.rank == 0)
            printf("eval: %s: %.0f tokens scored (windows of %d), mean loss %.6f nats/token, "
                   "perplexity %.4f; weights: %s\n", r.cfg.data_val, scored, r.cfg.seq_len, loss,
                   exp(loss), what);
    }
    watch_close(w);
    checkpoint_dir_close(&lock_fd);
    run_teardown(&r);
    return rc;
}

int cmd_train(int argc, char **argv) { return job_command(argc, argv, 1); }
int cmd_eval(int argc, char **argv) { return job_command(argc, argv, 0); }
