/* A run of a job: the set-up `train`, `eval` and `generate` share (setup.c: config,
 * ranks, backend, data, plan, engine, model), where its weights come from (start.c), the
 * training loop (loop.c), validation (validate.c). */
#ifndef SHLM_RUN_H
#define SHLM_RUN_H

#include <mpi.h>

#include "io/tokens.h"
#include "src/base/agree.h"
#include "src/ckpt/checkpoint.h"
#include "kernels/ops.h"
#include "src/job/config.h"
#include "src/data/data_loader.h"
#include "src/data/data_mix.h"
#include "src/job/fit.h"
#include "src/engine/fsdp.h"
#include "src/ckpt/hf_files.h"
#include "src/model/family.h"
#include "src/tokenizer/tokenizer.h"
#include "src/watch/watch.h"
#include "src/engine/topology.h"

typedef struct run {
    job_config cfg;
    int rank, world;          /* MPI_COMM_WORLD */
    int local_rank, local_size;
    const shlm_ops *ops;
    const shlm_comm *comm;
    topology topo;
    data_mix_list train_list; /* data.train: one file or a weighted mixture */
    token_file train_tf[DATA_MIX_MAX]; /* its files, train_list.n of them open */
    token_file val_tf;
    int have_val;
    job_plan plan;            /* what the engine, the model and the ops allocate */
    int have_plan;
    fsdp_engine *engine;
    model *model;             /* the job's family's model (src/model/family.h) */
    model_gen *gen;           /* its KV-cache generator (generate, a training run's closing
                               * sample), or NULL */
    int gen_held;             /* every unit stays gathered through a generation (the
                               * plan's hold, NO_SHARD's buffers, or one fp32 shard) */
    size_t allocated_at_setup;/* ops->allocated_bytes() after set-up (backends that count) */
    size_t device_base;       /* device memory in use before the arena (mem_info) */
    tokenizer *tok;           /* data.tokenizer (every rank opens it) */
    hf_files hf;              /* training: the model's and tokenizer's Hugging Face files,
                               * kept in every checkpoint for export */
    int grad_accum;           /* micro-batches per rank per step */
    uint64_t base_fingerprint;/* LoRA: the frozen base's (fsdp_base_fingerprint) as loaded */
} run;

/* Loads the job and builds everything; returns 0 or -1 (message already printed).
 * need_train_data = 0: a forward-only command (eval, generate: JOB_FORWARD, an engine
 * without gradients or moments, no activations kept for a backward). A training run
 * whose job samples at its end (train.sample_tokens) gets its closing sample's generator
 * (job_sample_gen). */
int run_setup(run *r, const char *job_path, int n_sets, char *const *sets, int need_train_data);
void run_teardown(run *r);

/* run_setup in two halves, for a command that reads its input with the job's tokenizer
 * before anything is allocated (generate): run_setup_begin loads the job and opens the
 * ranks' backends, data and tokenizer; run_setup_end makes the plan (with `gen`'s
 * generator: NULL for none), checks it fits, and allocates the engine, the model and the
 * generator. Each returns 0 or -1 (message printed), as run_setup. */
typedef struct run_gen_request {
    int rows;       /* the generator's rows (0: none) */
    int shrink;     /* fewer rows, halving down to 1, where that makes the plan fit */
    int cap;        /* tokens each row's cache holds */
    int hold;       /* keep every unit gathered through the generation where that fits
                     * (tried first), else gather unit by unit each step */
} run_gen_request;
int run_setup_begin(run *r, const char *job_path, int n_sets, char *const *sets,
                    int need_train_data);
int run_setup_end(run *r, int need_train_data, const run_gen_request *gen);

/* 0 when the job's tokenizer spells only ids the model has (its vocabulary is at most
 * model.vocab_size), else -1 with one line naming the tokenizer's file and the model's
 * source. Local. run_setup checks it where the job names a tokenizer (data.tokenizer, or
 * model.init_from's), or a training run will sample text; generate checks it for a text
 * prompt. */
int run_check_tokenizer(const run *r, char *err, size_t errlen);

/* The weights of a forward-only command: ckpt (generate/eval --ckpt: a checkpoint file
 * or directory, or a Hugging Face directory) when not NULL, else checkpoint.resume's
 * (auto: checkpoint.dir's latest), else model.init_from's, else the seed's
 * initialisation, which rank 0 says. what receives the source, for messages. Collective;
 * returns 0, or -1 (message printed). */
int run_load_weights(run *r, const char *ckpt, char *what, size_t whatlen);

/* Mean loss over the validation set (or its first eval_batches micro-batches) into
 * *loss, and the number of targets scored (masked ones are not) into *scored (may be
 * NULL). Collective; returns 0, or -1 on every rank (message printed once) when a rank's
 * token file changed under the run, or the number of a stop signal (src/base/signals.h) seen
 * by any rank between two batches: every rank ends the pass there and *loss is NaN, never
 * the mean of a part. */
int run_validate(run *r, double *loss, double *scored);

/* The state a training run starts from: checkpoint.resume (weights, moments, step, data
 * position) under the resume rules (what a resumed job may change, checked against the
 * checkpoint's state before any tensor is read), else model.init_from (weights), else
 * the seed's initialisation and step 0. Collective; returns 0, or -1 (message printed). */
int run_load_initial(run *r, ckpt_state *st);

/* LoRA: the frozen base as a person names it: model.init_from, or "initialised from
 * train.seed = N", and with lora.base_dtype = nf4 ", stored as NF4[ with double quant]"
 * (what a LoRA checkpoint keeps as lora.base). */
void run_base_name(const job_config *c, char *out, size_t outlen);

/* LoRA: checks that the frozen base is what was loaded (its fingerprint as at the start),
 * rank 0 printing both; nothing without LoRA. Collective; 0, or -1 (message printed). */
int run_check_base(run *r);

/* Trains steps st->step+1 .. the job's end (train.stop_after, else train.steps), watched
 * by w: the step line, metrics, checkpoints, validation, stop signals, the closing
 * summary, trace and sample. Collective; returns 0, or -1 (message printed). */
int run_train(run *r, const ckpt_state *st, watch *w);

/* The plan check after training: nothing was allocated through the ops after set-up (the
 * cpu backend's count), and on a device the memory in use grew by the plan's total. */
void run_plan_check_end(const run *r, size_t device_peak);

#endif
