/* The shard plan of a job (src/engine/shard_plan.h over its Llama model), built once for
 * `train`'s allocation and fit check and for `shardlm plan`, and the check that a run
 * allocated what its plan says. */
#ifndef SHLM_FIT_H
#define SHLM_FIT_H

#include <stddef.h>

#include "kernels/ops.h"
#include "src/job/config.h"
#include "src/engine/model.h"
#include "src/engine/shard_plan.h"

typedef struct job_plan {
    model_desc md;        /* the job's model (over c->model: the job must outlive it) */
    shard_plan plan;
} job_plan;

/* What one choice of the job's knobs is: the strategy, group sizes and micro-batch may
 * differ from the job's (plan's verdict tries others). */
typedef struct job_point {
    fsdp_strategy strategy;
    int S, R;
    int micro_batch;
    model_ac ac;
} job_point;

/* The job's own point: its strategy, micro-batch and checkpointing on groups S x R. */
job_point job_point_of(const job_config *c, fsdp_strategy strategy, int S, int R);

/* What generation adds to a job's plan: a KV-cache generator of `rows` sequences of up to
 * `cap` tokens each (no rows: none), and whether the engine holds every unit gathered for
 * the whole generation (plan_params.hold). */
typedef struct job_gen {
    int rows, cap, hold;
} job_gen;

/* The generator of a training run's closing sample (train.sample_tokens > 0; else none):
 * one row whose cache holds the prompt and the sample, the prompt counted as its text's
 * bytes + 2 (no tokenizer here makes more tokens of a text: byte-level ones at most one a
 * byte, SentencePiece's pieces one a byte or character and its dummy prefix, and a bos),
 * at most train.seq_len. Beyond its cache a sample recomputes its window each token. */
job_gen job_sample_gen(const job_config *c);

/* Builds the plan of job c at point pt on a backend of act dtype `act` (ops: the op
 * scratch and the arena's rounding; may be NULL). forward_only: eval and generate (no
 * gradient state; every block recomputed, so nothing is kept for a backward).
 * registered_gathers: the comm backend registers gathered buffers itself. gen: what
 * generation adds (NULL: nothing). */
void job_plan_build(job_plan *jp, const job_config *c, const job_point *pt, shlm_dtype act,
                    const shlm_ops *ops, int forward_only, int registered_gathers,
                    const job_gen *gen);
void job_plan_free(job_plan *jp);

/* The host memory one of `ranks` ranks of this node may allocate, in *bytes: MemAvailable
 * of /proc/meminfo, or what the process's memory cgroup leaves where that is less (its
 * limit, cgroup v2 memory.max or v1 memory.limit_in_bytes, less its usage without the
 * inactive file cache, which the kernel reclaims first), divided by ranks. *what says
 * where the figure comes from ("this machine's available memory: 20.31 GiB (MemAvailable)
 * shared by 2 ranks"). 0, or -1 when /proc/meminfo cannot be read. Local. */
int fit_host_memory(int ranks, double *bytes, char *what, size_t whatlen);
/* The same with every path under root ("" for the system's; tests give a directory). */
int fit_host_memory_at(const char *root, int ranks, double *bytes, char *what,
                       size_t whatlen);

/* The fit check of a run's set-up, before anything is allocated: the plan's total per
 * rank against the `avail` bytes the rank may allocate (a device's free memory, or
 * fit_host_memory's share), `what` saying what they are. 0, or -1 with one line in err
 * naming the job, the bytes needed by category and those available, and what helps
 * (`shardlm plan JOB --ranks world` says which change fits). Local. */
int fit_check_memory(const shard_plan *plan, double avail, const char *what,
                     const char *job_path, int world, char *err, size_t errlen);

/* The fit check of fsdp.offload = optimizer's host memory (plan->host_bytes; nothing to
 * check without it), before anything is allocated: host_bytes plus `also` (what the same
 * memory holds besides: the plan's total on the cpu backend, whose buffers are host memory;
 * 0 on a device) against the `avail` bytes fit_host_memory gives a rank, `what` saying
 * what they are. 0, or -1 with one line in err naming the job, the bytes needed and those
 * available, and what helps. Local. */
int fit_check_host(const shard_plan *plan, double also, double avail, const char *what,
                   const char *job_path, char *err, size_t errlen);

/* The plan check of one rank: measured[c] against plan->bytes[c] for the engine's
 * categories and the activations (the op scratch is the backend's, measured on a device
 * by its memory's drop). Returns the number of categories that differ and prints one
 * line per difference ("plan check: rank R: CATEGORY allocated A bytes, the plan says P"). */
int fit_check_allocated(const shard_plan *plan, const size_t measured[PLAN_N_CATEGORIES],
                        int rank);

#endif
