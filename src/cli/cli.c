/* Command-line dispatch: `shardlm train|eval|data|plan ...`, MPI start-up and shutdown
 * around the commands that run on ranks. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "shlm_config.h"
#include "src/cli/cli_fail.h"
#include "src/cli/commands.h"
#include "src/cli/shardlm.h"
#include "src/base/signals.h"
#include "src/base/startup.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: shardlm <command> [args]   (shardlm <command> --help: its usage)\n"
            "  train JOB.ini [--set section.key=value ...]   train (run on every rank)\n"
            "  eval  JOB.ini [--ckpt CKPT]                   loss, perplexity, tokens scored on [data] val\n"
            "  generate JOB.ini [--ckpt CKPT] --prompt TEXT [--chat]\n"
            "                                                text from the model, streamed\n"
            "  data  prepare --tokenizer T [--width 2|4] IN.txt OUT.bin\n"
            "                                                make a token file (T: a tokenizer\n"
            "                                                file, model directory, or bytes)\n"
            "  data  encode|decode|tokenizer --tokenizer T   text <-> ids on stdin/stdout\n"
            "  data  random --vocab V --tokens N OUT.bin       random tokens, for benchmarks\n"
            "  plan  JOB.ini --ranks N [--ranks-per-node M] [--backend cpu|cuda]\n"
            "                                                per-rank memory and traffic, no allocation\n"
            "  plot  [--out DIR] RUN_DIR...                   PNGs of runs' metrics over steps (gnuplot)\n"
            "  ckpt  info|verify CKPT | export CKPT DIR       inspect, check, export to Hugging Face\n"
            "  keys  [--markdown]                            every job key, its default and meaning\n"
            "  --version, --help\n");
}

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    int uses_mpi; /* runs on every rank of an MPI job */
} command;

static const command commands[] = {
    {"train", cmd_train, 1},
    {"eval", cmd_eval, 1},
    {"data", cmd_data, 0},
    {"plan", cmd_plan, 0},
    {"plot", cmd_plot, 0},
    {"keys", cmd_keys, 0},
    {"ckpt", cmd_ckpt, 1},
    {"generate", cmd_generate, 1},
};

int shardlm_main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("shardlm %s\n", PACKAGE_VERSION);
        return 0;
    }
    /* a file-size limit (ulimit -f) must fail a write with EFBIG, reported with the
     * file's name, not kill the process with SIGXFSZ */
    signal(SIGXFSZ, SIG_IGN);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) != 0) continue;
        if (!commands[i].uses_mpi) return commands[i].run(argc - 1, argv + 1);
        /* Open MPI's sharedfp/lockedfile component overflows a buffer (abort) when
         * MPI_File_open gets a path of about 240 characters or more; shardlm uses no
         * shared file pointers, so it is left out unless the user chose otherwise */
        setenv("OMPI_MCA_sharedfp", "^lockedfile", 0);
        /* train: a stop signal (Slurm's warning, scancel) during start-up must not kill
         * the rank; MPI_Init keeps these handlers (src/base/signals.h) */
        if (commands[i].run == cmd_train) shlm_signals_install();
        startup_begin();
        /* MPI_THREAD_MULTIPLE: the watchdog's guard thread runs roll calls while the main
         * thread is inside a checkpoint's HDF5 collectives (kernels/comm/comm_watchdog.h); where
         * the library gives less, a hang there still ends, without the ranks named */
        int provided = MPI_THREAD_SINGLE;
        MPI_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided));
        startup_mark(STARTUP_MPI);
        int rc = commands[i].run(argc - 1, argv + 1);
        MPI_CHECK(MPI_Finalize());
        return rc;
    }
    char names[256] = "";
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), " %s", commands[i].name);
    return cli_fail(NULL, 2, "unknown command '%s' (commands:%s; see shardlm --help)", argv[1],
                    names);
}
