/* The job configuration: every key of a job file, its default, its validation, and
 * `--set section.key=value` overrides. */
#ifndef SHLM_CONFIG_H
#define SHLM_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/backends/backends.h"
#include "src/model/family.h"
#include "src/engine/topology.h"

/* What a job is loaded for: training needs the whole [train] schedule and data.train;
 * eval and generate (forward passes only) need neither, and train.seq_len defaults to
 * model.max_seq_len for them. */
typedef enum job_use { JOB_TRAIN = 0, JOB_FORWARD = 1 } job_use;

/* train.on_nonfinite */
typedef enum nonfinite_policy { NONFINITE_ABORT = 0, NONFINITE_SKIP = 1 } nonfinite_policy;

/* Every choice key (a word of a fixed list, e.g. fsdp.strategy) is parsed once, here, into
 * the enum its users take. */
typedef struct job_config {
    /* [model] */
    char preset[64];         /* shape preset; other [model] keys override it */
    char family[32];         /* the model family's name (model.family, resolved) */
    model_shape model;       /* the family's shape: model.family's [model] keys */
    char init_from[1024];    /* initial weights: a Hugging Face directory (which also gives
                              * the architecture: its config.json) or a shardlm checkpoint
                              * (weights only); empty = init from seed */
    int hf_model;            /* 1: init_from is a Hugging Face directory */

    /* [train] */
    int seq_len;             /* T */
    int seq_len_given;       /* the job set train.seq_len (else a JOB_FORWARD default) */
    int micro_batch;         /* sequences per rank per micro-batch */
    int global_batch;        /* sequences per optimizer step, over all ranks;
                              * 0 = micro_batch x ranks (resolved at start-up) */
    int steps;               /* optimizer steps */
    float lr, min_lr;        /* peak and final learning rate */
    int warmup_steps;        /* linear warm-up, then cosine decay to min_lr at `steps` */
    float weight_decay, beta1, beta2, eps;
    float grad_clip;         /* max global gradient L2 norm; 0 = off */
    uint64_t seed;           /* init, data order, sampling */
    int eval_every;          /* steps between validation passes; 0 = only at the end */
    int eval_batches;        /* micro-batches per validation pass; 0 = whole val set */
    int sample_tokens;       /* tokens sampled after training; 0 = none */
    char sample_prompt[256];
    float sample_temperature; /* 0 = greedy */
    float sample_top_p;
    int stop_after;          /* stop after this step (0 = at `steps`); the schedule still
                              * spans `steps`: for time-sliced jobs and resume tests */
    nonfinite_policy on_nonfinite; /* what a step whose loss or gradient norm is NaN or
                                    * infinite does (its update is never applied) */
    int max_skipped;         /* skip: at most this many such steps in a row, then abort */
    model_matmul matmul;     /* the blocks' linear layers: bf16 or an FP8 recipe */
    int fp8_fast_accum;      /* FP8 forward products may use fast accumulation */

    /* [lora] */
    lora_config lora;        /* rank 0: every parameter trains; else the base is frozen and
                              * the adapters train (src/engine/model.h "LoRA") */
    char lora_targets[128];  /* lora.targets as given (lora.targets the mask) */
    char lora_init_from[1024]; /* a PEFT adapter directory the adapters start from; "" =
                                * initialise them from train.seed */

    /* [fsdp] */
    fsdp_strategy strategy;
    shlm_dtype param_dtype;  /* dtype of gathered parameters */
    shlm_dtype reduce_dtype; /* dtype of gradient reductions */
    int prefetch;            /* gather the next unit while the current one computes */
    int fp8_all_gather;      /* fp8-tensorwise: the gather makes the weights' e4m3 codes */
    int offload;             /* 1: the optimizer's state in host memory (plan_params.offload) */
    model_ac activation_checkpointing;
    int shard_group_size;    /* 0 = the strategy's own group */
    int trace;               /* write the per-rank schedule trace to run_dir */

    /* [data] */
    char data_train[1024];   /* token file (shardlm data prepare) */
    char data_val[1024];     /* token file; empty = no validation */
    int shuffle;             /* 1: windows permuted per epoch from (seed, epoch) */
    int doc_mask;            /* 1: attention block-diagonal per packed document */
    char tokenizer[1024];    /* a tokenizer file or model directory, or "bytes"; default:
                              * model.init_from's when it holds one, else bytes */
    int tokenizer_given;     /* the job set data.tokenizer */

    /* [log] */
    int log_every;
    char run_dir[1024];      /* metrics.jsonl goes here */
    float peak_tflops;       /* MFU denominator per device; 0 = the device table's */
    char prometheus[256];    /* PORT | ADDR:PORT served by each node's local rank 0; "" = off */
    char prometheus_textfile[1024]; /* node_exporter textfile directory; "" = none */
    int telemetry_interval_ms; /* NVML sampling period; 0 = no telemetry */
    char tensorboard[1024];  /* TensorBoard event file directory, "auto" (<run_dir>/tb);
                              * "" = none */

    /* [checkpoint] */
    char ckpt_dir[1024];     /* step_<N>.h5 and `latest` go here; empty = no checkpoints */
    int ckpt_every;          /* save every N steps, and at the end; 0 = only at the end */
    int ckpt_keep;           /* keep the newest K checkpoints; 0 = keep all */
    char ckpt_resume[1024];  /* auto | none | PATH (a checkpoint file, or a directory
                              * whose `latest` names one) */
    int allow_steps_change;  /* a resume may change train.steps (schedule extended) */
    int allow_global_batch_change; /* ... train.global_batch (sample index kept) */
    int allow_seq_len_change;      /* ... train.seq_len (position re-expressed in tokens) */
    int allow_data_change;         /* ... data.train's file (the sample index kept) */
    int allow_mix_change;          /* ... a mixture's files or weights (each file's position
                                    * kept, the new weights from the next step) */
    int ckpt_direct_io;      /* saves write with O_DIRECT (io/ckpt_hdf5.h) */
    int ckpt_async;          /* saves written by a thread while training goes on */
    int ckpt_collective_io;  /* saves through MPI-IO use collective buffering */
    int ckpt_alignment;      /* datasets of at least this many bytes start at a multiple of
                              * it; 0 = HDF5's packing */

    /* [runtime] */
    shlm_backend_choice backend;
    int threads;             /* CPU threads per rank; 0 = cores / ranks on the node */
    float comm_timeout_s;    /* a collective unfinished this long ends the job */
    int ranks_per_node;      /* 0 = real nodes; > 0 = blocks of ranks act as nodes */
    int comm_delay_us;       /* benchmarks only: every collective takes at least this long */
    int profile;             /* time every op (synchronising) and print a breakdown */

    /* [cuda] */
    shlm_attention_kernels cuda_attention;
    int cuda_graphs;         /* generation replays a recorded decode step */

    /* [nccl] */
    shlm_nccl_cta_policy nccl_cta_policy;
    int nccl_copy_engine_allgather; /* all-gathers on the copy engines where NCCL can */

    job_use use;
    /* the job's text and where it came from, kept for messages and checkpoints */
    char path[1024];
    char *text;              /* file contents followed by the --set lines */
} job_config;

/* Reads a job file and applies overrides ("section.key=value"), then validates
 * everything. On error, writes one line naming the file, line (or --set) and key
 * into err and returns -1; 0 on success. */
int job_config_load(job_config *cfg, const char *path, int n_overrides,
                    char *const *overrides, char *err, size_t errlen);
/* The same for a use: JOB_TRAIN is job_config_load; JOB_FORWARD (eval, generate) does not
 * require train.steps, train.seq_len or data.train. */
int job_config_load_for(job_config *cfg, const char *path, int n_overrides,
                        char *const *overrides, job_use use, char *err, size_t errlen);
void job_config_free(job_config *cfg);

/* Prints the resolved configuration as a table (rank 0 calls it once); to out, the same
 * table (TensorBoard's copy of the job). */
void job_config_print(const job_config *cfg, int world_size);
void job_config_fprint(FILE *out, const job_config *cfg, int world_size);

/* Checks a value read from elsewhere (a checkpoint's attribute) against the bounds of the
 * job key `name` ("section.key"): the table's rule, so both sources obey one copy of it.
 * Returns 0, or -1 with the reason ("out of range, must be in [1, 65536]", "not an
 * integer", "not a number") in why. */
int job_key_check(const char *name, double v, char *why, size_t whylen);

/* A command-line option `opt` that stands for integer or floating-point key `name`
 * (generate's --top-p for train.sample_top_p): v parsed strictly (src/base/numbers.h) as the
 * key's type within the key's bounds, one copy of its rule. 0, or -1 with one line naming
 * the option and the value in err ("--top-p: '2' is out of range, must be in (0, 1]"). */
int job_key_option(const char *name, const char *opt, const char *v, double *out, char *err,
                   size_t errlen);

/* The word of choice key `name` ("section.key") whose value is v ("?" when there is none). */
const char *job_choice_name(const char *name, int v);

/* Every job key with its default and meaning, one a line, from the key table: as text,
 * or (markdown) as the table README.md holds. */
void job_keys_print(FILE *out, int markdown);

/* The model options of the job (train.matmul, train.fp8_fast_accum) with checkpointing ac
 * (the plan's: a forward-only command recomputes every block). */
model_opts job_model_opts(const job_config *c, model_ac ac);

/* 64-bit FNV-1a hash of the job's text, to check all ranks run the same job. */
uint64_t job_config_hash(const job_config *cfg);

#endif
