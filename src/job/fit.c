/* The job's shard plan and the allocation check of fit.h. */
#include "src/job/fit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/engine/adapters.h"
#include "src/model/family.h"

#define GIB 1073741824.0

job_point job_point_of(const job_config *c, fsdp_strategy strategy, int S, int R) {
    return (job_point){strategy, S, R, c->micro_batch, c->activation_checkpointing};
}

job_gen job_sample_gen(const job_config *c) {
    if (c->sample_tokens <= 0) return (job_gen){0, 0, 0};
    const size_t prompt = c->sample_prompt[0] ? strlen(c->sample_prompt) : 1; /* "\n" */
    const double want = (double)prompt + 2 + c->sample_tokens;
    return (job_gen){1, want < c->seq_len ? (int)want : c->seq_len, 0};
}

void job_plan_build(job_plan *jp, const job_config *c, const job_point *pt, shlm_dtype act,
                    const shlm_ops *ops, int forward_only, int registered_gathers,
                    const job_gen *gen) {
    model_shape_desc_open(&jp->md, &c->model);
    adapters_open(&jp->md, &c->lora);
    plan_params p = {.strategy = pt->strategy,
                     .S = pt->S,
                     .R = pt->R,
                     .act = act,
                     .param_dtype = c->param_dtype,
                     .reduce_dtype = c->reduce_dtype,
                     .forward_only = forward_only,
                     .B = pt->micro_batch,
                     .T = c->seq_len,
                     /* forward passes only: no block keeps activations for a backward
                      * (full's buffers: one block's scratch, the residual streams) */
                     .ac = forward_only ? MODEL_AC_FULL : pt->ac,
                     .matmul = c->matmul,
                     .ops = ops,
                     .registered_gathers = registered_gathers,
                     .fp8_all_gather = c->fp8_all_gather,
                     .offload = c->offload,
                     .hold = gen ? gen->hold : 0,
                     .gen_rows = gen ? gen->rows : 0,
                     .gen_cap = gen ? gen->cap : 0};
    shard_plan_build(&jp->plan, &jp->md, &p);
}

void job_plan_free(job_plan *jp) {
    shard_plan_free(&jp->plan);
    model_desc_close(&jp->md);
}

/* The number of the line "KEY NUMBER[ UNIT]" of a file of such lines (memory.stat,
 * /proc/meminfo), or -1. */
static double stat_value(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256], name[64];
    unsigned long long v;
    double found = -1;
    while (found < 0 && fgets(line, sizeof line, f))
        if (sscanf(line, "%63s %llu", name, &v) == 2 && strcmp(name, key) == 0) found = (double)v;
    fclose(f);
    return found;
}

/* The first unsigned number of a file ("max" and anything else: -1). */
static double file_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    unsigned long long v;
    const int n = fscanf(f, "%llu", &v);
    fclose(f);
    return n == 1 ? (double)v : -1;
}

/* What the process's memory cgroup leaves: limit - (usage - inactive file cache), or -1
 * without a limit. v2: the "0::PATH" line of /proc/self/cgroup, files under
 * /sys/fs/cgroup/PATH (or the mount's root, as in a container's own namespace); v1: the
 * "N:memory:PATH" line, under /sys/fs/cgroup/memory. */
static double cgroup_room(const char *root) {
    char line[1024], dir[1200] = "", path[1400];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int v2 = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = '\0';
        const char *controllers = c1 + 1, *path = c2 + 1;
        if (strcmp(controllers, "memory") == 0 || (strcmp(controllers, "") == 0 && !dir[0])) {
            v2 = controllers[0] == '\0';
            snprintf(dir, sizeof dir, "%s/sys/fs/cgroup%s%s", root, v2 ? "" : "/memory",
                     strcmp(path, "/") == 0 ? "" : path);
            if (!v2) break; /* v1's memory line wins over a hybrid's v2 line */
        }
    }
    fclose(f);
    if (!dir[0]) return -1;
    const char *limit_name = v2 ? "memory.max" : "memory.limit_in_bytes";
    const char *usage_name = v2 ? "memory.current" : "memory.usage_in_bytes";
    const char *inactive_name = v2 ? "inactive_file" : "total_inactive_file";
    snprintf(path, sizeof path, "%s/%s", dir, limit_name);
    if (access(path, R_OK) != 0) /* not the mount's path: a namespace whose root it is */
        snprintf(dir, sizeof dir, "%s/sys/fs/cgroup%s", root, v2 ? "" : "/memory");
    snprintf(path, sizeof path, "%s/%s", dir, limit_name);
    const double limit = file_number(path);
    /* v1 writes "no limit" as a number near 2^63 */
    if (limit < 0 || limit >= 0x1p62) return -1;
    snprintf(path, sizeof path, "%s/%s", dir, usage_name);
    double usage = file_number(path);
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    const double inactive = stat_value(path, inactive_name);
    if (usage < 0) usage = 0;
    if (inactive > 0 && inactive < usage) usage -= inactive;
    return limit > usage ? limit - usage : 0;
}

int fit_host_memory_at(const char *root, int ranks, double *bytes, char *what,
                       size_t whatlen) {
    char path[1100];
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    const double avail = stat_value(path, "MemAvailable:");
    if (avail < 0) return -1;
    const double mem = avail * 1024, room = cgroup_room(root); /* meminfo counts kB */
    const int cg = room >= 0 && room < mem;
    const double host = cg ? room : mem;
    if (ranks < 1) ranks = 1;
    *bytes = host / ranks;
    snprintf(what, whatlen, "this machine's available memory: %.2f GiB (%s) shared by %d "
             "rank%s", host / GIB, cg ? "its memory cgroup's limit less its usage"
             : "MemAvailable", ranks, ranks > 1 ? "s" : "");
    return 0;
}

int fit_host_memory(int ranks, double *bytes, char *what, size_t whatlen) {
    return fit_host_memory_at("", ranks, bytes, what, whatlen);
}

int fit_check_memory(const shard_plan *pl, double avail, const char *what,
                     const char *job_path, int world, char *err, size_t errlen) {
    if ((double)pl->total <= avail) return 0;
    snprintf(err, errlen,
             "%s: the job needs %.2f GiB per rank (sharded state %.2f, buffers %.2f, "
             "activations %.2f, op scratch %.2f) but %.2f GiB are free per rank (%s): add "
             "ranks, lower train.micro_batch or use fsdp.activation_checkpointing (shardlm plan "
             "%.200s --ranks %d says which fits)", job_path, pl->total / GIB, pl->state / GIB,
             pl->buffers / GIB, pl->bytes[PLAN_ACTIVATIONS] / GIB,
             pl->bytes[PLAN_OP_SCRATCH] / GIB, avail / GIB, what, job_path, world);
    return -1;
}

int fit_check_host(const shard_plan *pl, double also, double avail, const char *what,
                   const char *job_path, char *err, size_t errlen) {
    if (!pl->offload || (double)pl->host_bytes + also <= avail) return 0;
    char besides[96] = "";
    if (also > 0) snprintf(besides, sizeof besides, ", and the plan's other buffers %.2f", also / GIB);
    snprintf(err, errlen,
             "%s: fsdp.offload = optimizer needs %.2f GiB of host memory per rank (master and "
             "AdamW moments %.2f, gradient and upload staging %.2f%s) but %.2f GiB are free per "
             "rank (%s): add nodes or use fsdp.offload = none", job_path,
             (pl->host_bytes + also) / GIB, (double)pl->bytes[PLAN_GRAD] * 3 / GIB,
             (pl->host_bytes - (double)pl->bytes[PLAN_GRAD] * 3) / GIB, besides, avail / GIB, what);
    return -1;
}

int fit_check_allocated(const shard_plan *plan, const size_t measured[PLAN_N_CATEGORIES],
                        int rank) {
    int bad = 0;
    for (int c = 0; c <= PLAN_ACTIVATIONS; c++)
        if (measured[c] != plan->bytes[c]) {
            printf("plan check: rank %d: %s allocated %zu bytes, the plan says %zu\n", rank,
                   plan_category_names[c], measured[c], plan->bytes[c]);
            bad++;
        }
    return bad;
}
