/* `shardlm plan JOB.ini --ranks N [--ranks-per-node M]`: per-rank memory and per-step
 * communication of a job on N ranks, computed without allocating the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "shlm_config.h"
#include "src/commands.h"
#include "src/config.h"
#include "src/fsdp.h"
#include "src/llama.h"
#include "src/topology.h"

static void row(const char *key, size_t bytes, const char *what) {
    printf("  %-24s %16zu  %10.3f GiB  %s\n", key, bytes, bytes / 1073741824.0, what);
}

static int usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "shardlm: error: plan: %s%s%s (usage: shardlm plan JOB.ini --ranks N "
            "[--ranks-per-node M] [--backend cpu|cuda] [--set section.key=value ...])\n",
            msg, arg ? " " : "", arg ? arg : "");
    return 2;
}

static int parse_positive(const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < 1 || v > (1 << 24)) return -1;
    *out = (int)v;
    return 0;
}

int cmd_plan(int argc, char **argv) {
    const char *job = NULL, *backend = NULL;
    int ranks = 0, rpn = -1, n_sets = 0;
    char **sets = calloc((size_t)argc + 1, sizeof(char *));
    if (!sets) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: shardlm plan JOB.ini --ranks N [--ranks-per-node M] [--backend cpu|cuda]\n"
                   "                         [--set section.key=value ...]\n"
                   "  Each rank's bytes of master weights, gradients, moments, gathered and\n"
                   "  gradient buffers and activations, and the bytes it sends per step, for the\n"
                   "  job on N ranks (M per node), computed without allocating anything; a run\n"
                   "  prints the same figures measured. With model.init_from a Hugging Face\n"
                   "  directory the shape is its config.json's.\n");
            free(sets);
            return 0;
        }
        if (strcmp(a, "--ranks") == 0 || strcmp(a, "--ranks-per-node") == 0 ||
            strcmp(a, "--backend") == 0 || strcmp(a, "--set") == 0) {
            if (i + 1 >= argc) return usage_error("missing value after", a);
            const char *v = argv[++i];
            if (strcmp(a, "--set") == 0) sets[n_sets++] = (char *)v;
            else if (strcmp(a, "--backend") == 0) backend = v;
            else if (parse_positive(v, strcmp(a, "--ranks") == 0 ? &ranks : &rpn) != 0)
                return usage_error("not a positive integer:", v);
        } else if (a[0] == '-') {
            return usage_error("unknown option", a);
        } else if (job) {
            return usage_error("more than one job file:", a);
        } else {
            job = a;
        }
    }
    if (!job) return usage_error("no job file given", NULL);
    if (ranks < 1) return usage_error("--ranks N is required", NULL);

    job_config cfg;
    char err[1536];
    if (job_config_load(&cfg, job, n_sets, sets, err, sizeof err) != 0) {
        fprintf(stderr, "shardlm: error: %s\n", err);
        free(sets);
        return 1;
    }
    free(sets);
    if (!backend) backend = cfg.backend;
    if (strcmp(backend, "auto") == 0) {
        /* as `train` resolves it on this machine: cuda when built and a GPU is visible
         * (plan for GPUs from a login node with --backend cuda) */
        const shlm_ops *cuda = shlm_ops_find("cuda");
        backend = cuda && cuda->available() ? "cuda" : "cpu";
    }
    if (strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0) {
        job_config_free(&cfg);
        return usage_error("--backend must be cpu or cuda, not", backend);
    }
    topology_options topt = {.ranks_per_node = rpn > 0 ? rpn : cfg.ranks_per_node,
                             .shard_group_size = cfg.shard_group_size};
    int rc = 1;
    if (strategy_from_name(cfg.strategy, &topt.strategy, err, sizeof err) != 0 ||
        topology_check(ranks, &topt, err, sizeof err) != 0) {
        fprintf(stderr, "shardlm: error: %s: %s\n", cfg.path, err);
        goto done;
    }
    /* group sizes, as topology_create makes them */
    int node = topt.ranks_per_node > 0 ? topt.ranks_per_node : ranks;
    int S = topt.shard_group_size > 0            ? topt.shard_group_size
            : topt.strategy == FSDP_NO_SHARD     ? 1
            : topt.strategy == FSDP_HYBRID_SHARD ? node
                                                 : ranks;
    int R = ranks / S;
    int per_step = cfg.micro_batch * ranks;
    int global = cfg.global_batch > 0 ? cfg.global_batch : per_step;
    if (global % per_step != 0) {
        fprintf(stderr, "shardlm: error: %s: train.global_batch (%d) must be a multiple of "
                "train.micro_batch (%d) x ranks (%d)\n", cfg.path, global, cfg.micro_batch, ranks);
        goto done;
    }
    int accum = global / per_step;
    shlm_dtype act = strcmp(backend, "cuda") == 0 ? SHLM_BF16 : SHLM_F32;
    fsdp_options opt = {.param_dtype = strcmp(cfg.param_dtype, "bf16") == 0 ? SHLM_BF16 : SHLM_F32,
                        .reduce_dtype = strcmp(cfg.reduce_dtype, "bf16") == 0 ? SHLM_BF16 : SHLM_F32};
    llama_ac ac = strcmp(cfg.activation_checkpointing, "full") == 0        ? LLAMA_AC_FULL
                  : strcmp(cfg.activation_checkpointing, "selective") == 0 ? LLAMA_AC_SELECTIVE
                                                                           : LLAMA_AC_NONE;
    fsdp_plan_bytes pb;
    fsdp_plan(&cfg.model, act, topt.strategy, S, R, &opt, &pb);
    size_t acts = llama_activation_bytes_for(&cfg.model, act, cfg.micro_batch, cfg.seq_len, ac);
    long long P = llama_param_count(&cfg.model);
    size_t state = pb.master + pb.grad + pb.moments;
    size_t total = state + pb.gathered + pb.grad_buffers + acts;

    printf("# shardlm plan: %s on %d ranks, %s, shard group %d x replica group %d%s\n", cfg.path,
           ranks, strategy_name(topt.strategy), S, R,
           topt.ranks_per_node > 0 ? " (ranks_per_node set)" : "");
    printf("# model %s: %lld parameters; backend %s (activations %s), param_dtype %s, "
           "reduce_dtype %s\n", cfg.preset[0] ? cfg.preset : cfg.hf_model ? cfg.init_from : "(custom)",
           P, backend,
           shlm_dtype_name(act), cfg.param_dtype, cfg.reduce_dtype);
    printf("# micro_batch %d x seq_len %d, %d micro-batch(es) per step, global batch %d, "
           "activation checkpointing %s\n", cfg.micro_batch, cfg.seq_len, accum, global,
           cfg.activation_checkpointing);
    printf("per rank memory (bytes)\n");
    row("master_bytes", pb.master, "fp32 master weights (shard)");
    row("grad_bytes", pb.grad, "fp32 gradient (shard)");
    row("moments_bytes", pb.moments, "AdamW exp_avg + exp_avg_sq (shard)");
    row("sharded_state_bytes", state, "");
    printf("  %-24s %16.0f  %10.3f GiB  16 P / S with P = %lld, S = %d\n", "16P/S",
           16.0 * (double)P / S, 16.0 * (double)P / S / 1073741824.0, P, S);
    row("gathered_bytes", pb.gathered, "gathered parameter buffers");
    row("grad_buffer_bytes", pb.grad_buffers, "full-unit gradient buffers for reduce-scatter");
    row("activation_bytes", acts, "activations and their gradients");
    row("total_bytes", total, "");
    printf("per optimizer step, bytes each rank sends\n");
    row("shard_group_bytes", pb.shard_wire_per_micro * (size_t)accum,
        "all-gather + reduce-scatter in the shard group");
    row("replica_group_bytes", pb.replica_wire_per_step, "all-reduce of gradient shards");
    rc = 0;
done:
    job_config_free(&cfg);
    return rc;
}
