/* `shardlm plan JOB.ini --ranks N [--ranks-per-node M] [--device NAME | --device-gib G]`:
 * per-rank memory and per-step communication of a job on N ranks, computed without
 * allocating the model, and a verdict: whether it fits the device (named, of G GiB, or
 * the visible one) and, when it does not, which single change would make it fit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "shlm_config.h"
#include "src/ckpt/checkpoint.h"
#include "src/cli/cli_fail.h"
#include "src/cli/commands.h"
#include "src/job/config.h"
#include "src/watch/device_table.h"
#include "src/job/fit.h"
#include "src/engine/fsdp.h"
#include "src/model/family.h"
#include "src/base/numbers.h"
#include "src/engine/topology.h"

static void row(const char *key, size_t bytes, const char *what) {
    printf("  %-24s %16zu  %10.3f GiB  %s\n", key, bytes, bytes / 1073741824.0, what);
}

static int usage_error(const char *msg, const char *arg) {
    return cli_fail("plan", 2, "%s%s%s (usage: shardlm plan JOB.ini --ranks N "
                    "[--ranks-per-node M] [--backend cpu|cuda] [--device NAME | --device-gib G] "
                    "[--set section.key=value ...])", msg, arg ? " " : "", arg ? arg : "");
}

/* What a rank of the job needs with these choices: the plan's total. */
typedef struct plan_point {
    int ranks, micro_batch;
    fsdp_strategy strategy;
    model_ac ac;
} plan_point;

static size_t point_bytes(const job_config *cfg, const topology_options *topt, shlm_dtype act,
                          const shlm_ops *ops, const plan_point *p) {
    topology_options t = *topt;
    t.strategy = p->strategy;
    job_point jp = {p->strategy, 0, 0, p->micro_batch, p->ac};
    topology_group_sizes(p->ranks, &t, &jp.S, &jp.R);
    job_plan plan;
    const job_gen sample = job_sample_gen(cfg);
    job_plan_build(&plan, cfg, &jp, act, ops, 0, 0, &sample);
    size_t total = plan.plan.total;
    job_plan_free(&plan);
    return total;
}

/* The verdict against cap bytes per rank (what the device holds, named by `device`), and
 * when it does not fit, each single change that would: activation checkpointing, a
 * smaller micro-batch (the global batch kept, more accumulation), FULL_SHARD, more ranks
 * (the global batch kept where it divides). */
static void verdict(const job_config *cfg, const topology_options *topt, shlm_dtype act,
                    const shlm_ops *ops, const plan_point *now, int global, double cap,
                    const char *device) {
    const double gib = 1073741824.0;
    size_t need = point_bytes(cfg, topt, act, ops, now);
    if (need <= cap) {
        printf("verdict: fits %s: %.2f of %.2f GiB per rank, %.2f GiB to spare%s\n", device,
               need / gib, cap / gib, (cap - need) / gib,
               ops && ops->scratch_bytes ? " (the CUDA context and NCCL's own buffers come on top)"
                                         : "");
        return;
    }
    printf("verdict: does not fit %s: needs %.2f GiB per rank, %.2f GiB more than its %.2f GiB\n",
           device, need / gib, (need - cap) / gib, cap / gib);
    int any = 0;
    /* from the most kept to the least: the first that fits recomputes the least */
    static const model_ac lighter[] = {MODEL_AC_NONE, MODEL_AC_SELECTIVE, MODEL_AC_FULL};
    static const char *const ac_names[] = {"none", "selective", "full"};
    int at = now->ac == MODEL_AC_FULL ? 2 : now->ac == MODEL_AC_SELECTIVE ? 1 : 0;
    for (int k = at + 1; k < 3; k++) {
        plan_point p = *now;
        p.ac = lighter[k];
        size_t b = point_bytes(cfg, topt, act, ops, &p);
        if (b <= cap) {
            printf("  would fit with --set fsdp.activation_checkpointing=%s: %.2f GiB\n",
                   ac_names[k], b / gib);
            any = 1;
            break;
        }
    }
    for (int mb = now->micro_batch / 2; mb >= 1; mb /= 2) {
        plan_point p = *now;
        p.micro_batch = mb;
        size_t b = point_bytes(cfg, topt, act, ops, &p);
        if (b <= cap && global % (mb * now->ranks) == 0) {
            printf("  would fit with --set train.micro_batch=%d: %.2f GiB (%d micro-batches per "
                   "step)\n", mb, b / gib, global / (mb * now->ranks));
            any = 1;
            break;
        }
    }
    if (now->strategy != FSDP_FULL_SHARD && topt->shard_group_size == 0) {
        plan_point p = *now;
        p.strategy = FSDP_FULL_SHARD;
        size_t b = point_bytes(cfg, topt, act, ops, &p);
        if (b <= cap) {
            printf("  would fit with --set fsdp.strategy=FULL_SHARD: %.2f GiB\n", b / gib);
            any = 1;
        }
    }
    if (topt->shard_group_size == 0 && now->strategy != FSDP_NO_SHARD &&
        (now->strategy != FSDP_HYBRID_SHARD || topt->ranks_per_node == 0)) {
        for (int k = 1; k <= 16; k++) {
            plan_point p = *now;
            p.ranks = now->ranks << k;
            size_t b = point_bytes(cfg, topt, act, ops, &p);
            if (b <= cap) {
                printf("  would fit with --ranks %d: %.2f GiB%s\n", p.ranks, b / gib,
                       global % (now->micro_batch * p.ranks)
                           ? " (train.global_batch must then be a multiple of micro_batch x ranks)"
                           : "");
                any = 1;
                break;
            }
        }
    }
    if (!any) { /* all of them together, on as many ranks as that takes */
        plan_point p = {now->ranks, 1, FSDP_FULL_SHARD, MODEL_AC_FULL};
        size_t b = point_bytes(cfg, topt, act, ops, &p);
        for (int k = 0; k <= 16 && b > cap; k++) {
            p.ranks = now->ranks << k;
            b = point_bytes(cfg, topt, act, ops, &p);
        }
        if (b <= cap)
            printf("  no single change fits; together: --ranks %d --set fsdp.strategy=FULL_SHARD "
                   "--set fsdp.activation_checkpointing=full --set train.micro_batch=1: %.2f GiB\n",
                   p.ranks, b / gib);
        else
            printf("  nothing fits: FULL_SHARD, full checkpointing and micro-batch 1 still need "
                   "%.2f GiB per rank on %d ranks (the activations of one sequence of %d tokens)\n",
                   b / gib, p.ranks, cfg->seq_len);
    }
}


int cmd_plan(int argc, char **argv) {
    const char *job = NULL, *backend = NULL, *device = NULL;
    double device_gib = 0;
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
            strcmp(a, "--backend") == 0 || strcmp(a, "--set") == 0 ||
            strcmp(a, "--device") == 0 || strcmp(a, "--device-gib") == 0) {
            if (i + 1 >= argc) return usage_error("missing value after", a);
            const char *v = argv[++i];
            char err[320];
            long long n = 0;
            if (strcmp(a, "--set") == 0) sets[n_sets++] = (char *)v;
            else if (strcmp(a, "--backend") == 0) backend = v;
            else if (strcmp(a, "--device") == 0) device = v;
            else if (strcmp(a, "--device-gib") == 0) {
                if (num_option_double(a, v, 0, 1e6, NUM_LO_OPEN | NUM_HI_OPEN, &device_gib, err,
                                      sizeof err) != 0)
                    return usage_error(err, NULL);
            } else {
                /* ranks: the topology's limit (2^24, as runtime.ranks_per_node) */
                if (num_option_int(a, v, 1, 1 << 24, &n, err, sizeof err) != 0)
                    return usage_error(err, NULL);
                *(strcmp(a, "--ranks") == 0 ? &ranks : &rpn) = (int)n;
            }
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
    if (device && device_gib > 0) return usage_error("give --device or --device-gib, not both", NULL);
    const device_spec *named = device ? device_table_by_short_name(device) : NULL;
    if (device && (!named || named->mem_mib == 0)) {
        char names[512];
        device_table_short_names(names, sizeof names);
        return cli_fail("plan", 2, "--device %s: %s (known: %s; or give --device-gib G)", device,
                        named ? "its memory is not in the device table"
                              : "not in the device table", names);
    }

    job_config cfg;
    char err[1536];
    if (job_config_load(&cfg, job, n_sets, sets, err, sizeof err) != 0) {
        free(sets);
        return cli_fail(NULL, 1, "%s", err);
    }
    free(sets);
    if (!backend) backend = shlm_backend_choice_name(cfg.backend);
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
    topt.strategy = cfg.strategy;
    int rc = 1;
    if (topology_check(ranks, &topt, err, sizeof err) != 0) {
        cli_fail(NULL, 1, "%s: %s", cfg.path, err);
        goto done;
    }
    int S, R;
    topology_group_sizes(ranks, &topt, &S, &R);
    int per_step = cfg.micro_batch * ranks;
    int global = cfg.global_batch > 0 ? cfg.global_batch : per_step;
    if (global % per_step != 0) {
        cli_fail(NULL, 1, "%s: train.global_batch (%d) must be a multiple of train.micro_batch "
                 "(%d) x ranks (%d)", cfg.path, global, cfg.micro_batch, ranks);
        goto done;
    }
    int accum = global / per_step;
    shlm_dtype act = strcmp(backend, "cuda") == 0 ? SHLM_BF16 : SHLM_F32;
    /* the ops' scratch depends on the device (its SM count): counted where one is visible */
    const shlm_ops *ops = shlm_ops_find(backend);
    if (ops && ops->scratch_bytes && !ops->available()) ops = NULL;
    const job_point pt = job_point_of(&cfg, topt.strategy, S, R);
    job_plan jp;
    const job_gen sample = job_sample_gen(&cfg);
    job_plan_build(&jp, &cfg, &pt, act, ops, 0, 0, &sample);
    const shard_plan *pl = &jp.plan;
    long long P = model_shape_param_count(&cfg.model);

    printf("# shardlm plan: %s on %d ranks, %s, shard group %d x replica group %d%s\n", cfg.path,
           ranks, strategy_name(topt.strategy), S, R,
           topt.ranks_per_node > 0 ? " (ranks_per_node set)" : "");
    printf("# model %s: %lld parameters; backend %s (activations %s), param_dtype %s, "
           "reduce_dtype %s\n", cfg.preset[0] ? cfg.preset : cfg.hf_model ? cfg.init_from : "(custom)",
           P, backend,
           shlm_dtype_name(act), shlm_dtype_name(cfg.param_dtype), shlm_dtype_name(cfg.reduce_dtype));
    printf("# micro_batch %d x seq_len %d, %d micro-batch(es) per step, global batch %d, "
           "activation checkpointing %s\n", cfg.micro_batch, cfg.seq_len, accum, global,
           job_choice_name("fsdp.activation_checkpointing", (int)cfg.activation_checkpointing));
    printf("per rank memory (bytes)\n");
    const char *const what_row[PLAN_N_CATEGORIES] = {
        "fp32 master weights (shard)", "fp32 gradient (shard)",
        "AdamW exp_avg + exp_avg_sq (shard)",
        cfg.lora.base_nf4 ? "QLoRA: the frozen base (shard; the projections NF4, the rest in "
                            "fsdp.param_dtype)"
                          : "LoRA: the frozen base (shard, fsdp.param_dtype)",
        "fsdp.offload: the trained shard's device copy the gather reads",
        "gathered parameter buffers",
        "full-unit gradient buffers for reduce-scatter",
        "activations, their gradients, FP8 operands, the closing sample's KV cache",
        "the ops' scratch and the matmul library's workspace"};
    for (int k = PLAN_MASTER; k <= PLAN_PARAM_COPY; k++)
        row(plan_category_names[k], pl->bytes[k], what_row[k]);
    row("sharded_state_bytes", pl->state, "");
    printf("  %-24s %16.0f  %10.3f GiB  %s16 P / S with P = %lld, S = %d\n", "16P/S",
           16.0 * (double)P / S, 16.0 * (double)P / S / 1073741824.0,
           cfg.lora.rank > 0 ? "a full fine-tune's state: " : "", P, S);
    for (int k = PLAN_GATHERED; k <= PLAN_ACTIVATIONS; k++)
        row(plan_category_names[k], pl->bytes[k], what_row[k]);
    row(plan_category_names[PLAN_OP_SCRATCH], pl->bytes[PLAN_OP_SCRATCH],
        ops && ops->scratch_bytes ? what_row[PLAN_OP_SCRATCH]
        : strcmp(backend, "cpu") == 0 ? "none on the cpu backend"
                                      : "not counted: no GPU visible to size it");
    row("total_bytes", pl->total, "every row above: what train's fit check compares");
    const int per_node = topt.ranks_per_node > 0 ? topt.ranks_per_node : ranks;
    const int offload = pl->offload;
    const size_t host_bytes = pl->host_bytes, total = pl->total;
    if (offload) {
        row("host_bytes", host_bytes,
            "fsdp.offload: master, AdamW moments, gradient and upload staging in host memory "
            "(page-locked on a device), apart from the above");
        printf("  %-24s %16.0f  %10.3f GiB  %d ranks per node\n", "host_bytes_per_node",
               (double)host_bytes * per_node, (double)host_bytes * per_node / 1073741824.0,
               per_node);
    }
    /* src/ckpt/async.c: the same shards, in host memory, where a fresh run of the job
     * saves in the background */
    if (checkpoint_async_used(&cfg, 0, cfg.stop_after > 0 ? cfg.stop_after : cfg.steps))
        row("ckpt_staging_bytes", pl->bytes[PLAN_MASTER] + pl->bytes[PLAN_MOMENTS],
            "host memory of checkpoint.async's staging (master + moments), apart from the "
            "above; a run saves synchronously where the host lacks it");
    printf("per optimizer step, bytes each rank sends\n");
    row("shard_group_bytes", pl->shard_wire_per_micro * (size_t)accum,
        "all-gather + reduce-scatter in the shard group");
    row("replica_group_bytes", pl->replica_wire_per_step, "all-reduce of gradient shards");
    job_plan_free(&jp);

    char what[200] = "";
    double cap = 0;
    shlm_device_info di;
    size_t used = 0, dev_total = 0;
    if (named) {
        cap = named->mem_mib * 1048576.0;
        snprintf(what, sizeof what, "%s (%.0f MiB)", named->short_name, named->mem_mib);
    } else if (device_gib > 0) {
        cap = device_gib * 1073741824.0;
        snprintf(what, sizeof what, "a device of %g GiB", device_gib);
    } else if (strcmp(backend, "cuda") == 0 && ops && ops->mem_info &&
               ops->mem_info(&used, &dev_total) == 0) {
        cap = (double)dev_total;
        if (ops->device_info && ops->device_info(&di) == 0)
            snprintf(what, sizeof what, "this machine's %s", di.name);
        else
            snprintf(what, sizeof what, "this machine's GPU");
    } else if (strcmp(backend, "cpu") == 0) {
        /* what train's fit check compares with (src/job/fit.h) */
        if (fit_host_memory(per_node, &cap, what, sizeof what) != 0) cap = 0;
    }
    /* fsdp.offload: the host's share against its state (and on the cpu backend everything
     * else, which is host memory too), as train's fit check compares them */
    double host_cap = 0;
    char host_what[200];
    if (offload && fit_host_memory(per_node, &host_cap, host_what, sizeof host_what) == 0) {
        const double need = (double)host_bytes + (strcmp(backend, "cpu") == 0 ? (double)total : 0);
        printf("verdict: host memory: %s %s: fsdp.offload needs %.2f GiB per rank%s, %.2f GiB "
               "per node\n", need <= host_cap ? "fits" : "does not fit", host_what,
               need / 1073741824.0, strcmp(backend, "cpu") == 0 ? " (the plan's total included)" : "",
               need * per_node / 1073741824.0);
    }
    if (cap > 0) {
        plan_point now = {ranks, cfg.micro_batch, topt.strategy, pt.ac};
        verdict(&cfg, &topt, act, ops, &now, global, cap, what);
    } else {
        printf("verdict: no device to compare with (no GPU visible): give --device NAME or "
               "--device-gib G\n");
    }
    rc = 0;
done:
    job_config_free(&cfg);
    return rc;
}
