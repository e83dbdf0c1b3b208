/* The job configuration (see config.h): one table of every key drives parsing, defaults,
 * range checks and printing; cross-key checks and derived defaults follow the table. */
#include "src/config.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "io/config_file.h"
#include "io/errmsg.h"
#include "io/hf_model.h"
#include "src/prometheus.h"
#include "src/tokenizer.h"

typedef enum key_type {
    KT_INT,    /* int */
    KT_FLOAT,  /* float */
    KT_U64,    /* uint64_t, decimal or 0x-hex */
    KT_BOOL,   /* int 0/1: true/false, yes/no, on/off, 1/0 */
    KT_STRING, /* char[size]; may be "quoted" with \" \\ \n \t escapes */
    KT_ENUM,   /* an enum (int-sized): the index of the value in `choices` ("a|b|c"), whose
                * order is the enum's (checked below the table) */
} key_type;

enum key_flags {
    KF_REQUIRED = 1 << 0, /* no default: the job must set it */
    KF_MODEL = 1 << 1,    /* a model shape field: its default comes from the preset */
    KF_SHAPE = 1 << 2,    /* required when no preset is given */
    KF_DERIVED = 1 << 3,  /* default computed from other keys (see resolve_derived) */
    KF_PATH = 1 << 4,     /* a file: relative to the job file's directory when set there */
    KF_PRESET = 1 << 5,   /* must name a preset of llama_preset() */
    KF_MIN_OPEN = 1 << 6, /* value must be > min (not >=) */
    KF_MAX_OPEN = 1 << 7, /* value must be < max (not <=) */
    KF_TRAINING = 1 << 8, /* KF_REQUIRED only when the job trains (JOB_TRAIN) */
};

typedef struct key_def {
    const char *section, *key;
    key_type type;
    size_t offset, size;  /* of the field in job_config */
    const char *def;      /* default, as text, parsed like a value; NULL: see flags */
    double min, max;      /* inclusive bounds of numbers unless KF_*_OPEN */
    const char *choices;  /* KT_ENUM only: the words, in the enum's order */
    unsigned flags;
    const char *doc;      /* one line: what the key means (shardlm keys, README's table) */
} key_def;

#define F(field) offsetof(job_config, field), sizeof(((job_config *)0)->field)
#define NOLIM 0, 0
#define IMAX ((double)INT_MAX)
#define FMAX ((double)FLT_MAX)

static const key_def keys[] = {
    /* [model]: a preset is applied first, then these override it */
    {"model", "preset", KT_STRING, F(preset), "", NOLIM, NULL, KF_PRESET,
     "a shape preset (tiny, tinyllama-1b, llama2-7b, llama2-13b, llama2-70b); the other "
     "[model] keys override it"},
    {"model", "dim", KT_INT, F(model.dim), NULL, 1, 1 << 20, NULL, KF_MODEL | KF_SHAPE,
     "model width d"},
    {"model", "n_layers", KT_INT, F(model.n_layers), NULL, 1, 1 << 16, NULL, KF_MODEL | KF_SHAPE,
     "transformer blocks L"},
    {"model", "n_heads", KT_INT, F(model.n_heads), NULL, 1, 1 << 16, NULL, KF_MODEL | KF_SHAPE,
     "query heads; head_dim = dim / n_heads"},
    /* without a preset: n_kv_heads = n_heads (no GQA) */
    {"model", "n_kv_heads", KT_INT, F(model.n_kv_heads), NULL, 1, 1 << 16, NULL,
     KF_MODEL | KF_DERIVED,
     "key/value heads (grouped-query attention), dividing n_heads; without a preset: n_heads"},
    {"model", "ffn_dim", KT_INT, F(model.ffn_dim), NULL, 1, 1 << 24, NULL, KF_MODEL | KF_SHAPE,
     "SwiGLU hidden width"},
    {"model", "vocab_size", KT_INT, F(model.vocab_size), NULL, 2, 1 << 30, NULL,
     KF_MODEL | KF_SHAPE,
     "vocabulary V: rows of the embedding (and of lm_head)"},
    /* without a preset: max_seq_len = train.seq_len */
    {"model", "max_seq_len", KT_INT, F(model.max_seq_len), NULL, 1, 1 << 24, NULL,
     KF_MODEL | KF_DERIVED,
     "the longest sequence the model takes; without a preset: train.seq_len"},
    {"model", "norm_eps", KT_FLOAT, F(model.norm_eps), "1e-5", 0, 1, NULL, KF_MODEL | KF_MIN_OPEN,
     "RMSNorm epsilon"},
    {"model", "rope_theta", KT_FLOAT, F(model.rope_theta), "10000", 0, 1e12, NULL,
     KF_MODEL | KF_MIN_OPEN,
     "RoPE base"},
    {"model", "init_std", KT_FLOAT, F(model.init_std), "0.02", 0, 10, NULL, KF_MODEL | KF_MIN_OPEN,
     "standard deviation of the normal initialisation of every matrix"},
    {"model", "tie_word_embeddings", KT_BOOL, F(model.tie_word_embeddings), "false", NOLIM, NULL,
     KF_MODEL,
     "the output projection is the embedding (one tensor, as Hugging Face's "
     "tie_word_embeddings)"},
    /* a Hugging Face directory (config.json + safetensors) or a shardlm checkpoint whose
     * weights start the run; a resumed checkpoint wins over it */
    {"model", "init_from", KT_STRING, F(init_from), "", NOLIM, NULL, KF_PATH,
     "initial weights: a Hugging Face directory (whose config.json then gives every [model] "
     "key; those the job gives must agree) or a shardlm checkpoint (weights only); a resumed "
     "checkpoint wins over it"},

    /* [train] */
    /* eval and generate: default model.max_seq_len (and eval's windows no longer than the
     * validation file) */
    {"train", "seq_len", KT_INT, F(seq_len), NULL, 1, 1 << 24, NULL, KF_REQUIRED | KF_TRAINING,
     "tokens per sequence; eval and generate: model.max_seq_len (eval: at most the "
     "validation file)"},
    {"train", "micro_batch", KT_INT, F(micro_batch), "1", 1, 1 << 20, NULL, 0,
     "sequences per rank per micro-batch"},
    /* default 0: micro_batch x ranks, one micro-batch per rank per step */
    {"train", "global_batch", KT_INT, F(global_batch), "0", 0, 1 << 30, NULL, 0,
     "sequences per optimizer step over all ranks (accumulation = global / (micro x ranks)); "
     "0: micro_batch x ranks"},
    {"train", "steps", KT_INT, F(steps), NULL, 1, IMAX, NULL, KF_REQUIRED | KF_TRAINING,
     "optimizer steps (the schedule's length); not needed by eval and generate"},
    {"train", "lr", KT_FLOAT, F(lr), "3e-4", 0, 10, NULL, 0,
     "peak learning rate (after the linear warm-up; cosine decay to min_lr at the last step)"},
    /* default: min_lr = lr / 10 */
    {"train", "min_lr", KT_FLOAT, F(min_lr), NULL, 0, 10, NULL, KF_DERIVED,
     "final learning rate; default lr / 10"},
    {"train", "warmup_steps", KT_INT, F(warmup_steps), "0", 0, IMAX, NULL, 0,
     "steps of linear warm-up"},
    {"train", "weight_decay", KT_FLOAT, F(weight_decay), "0.1", 0, 10, NULL, 0,
     "AdamW's decoupled weight decay, on matrices only"},
    {"train", "beta1", KT_FLOAT, F(beta1), "0.9", 0, 1, NULL, KF_MAX_OPEN,
     "AdamW beta1"},
    {"train", "beta2", KT_FLOAT, F(beta2), "0.95", 0, 1, NULL, KF_MAX_OPEN,
     "AdamW beta2"},
    {"train", "eps", KT_FLOAT, F(eps), "1e-8", 0, 1, NULL, KF_MIN_OPEN,
     "AdamW epsilon"},
    {"train", "grad_clip", KT_FLOAT, F(grad_clip), "1.0", 0, FMAX, NULL, 0,
     "clip the global gradient norm to this; 0: off"},
    {"train", "seed", KT_U64, F(seed), "1337", NOLIM, NULL, 0,
     "initialisation, data order and sampling: a CPU run is reproducible bit for bit"},
    {"train", "eval_every", KT_INT, F(eval_every), "0", 0, IMAX, NULL, 0,
     "steps between validation passes on data.val; 0: only at the end"},
    {"train", "eval_batches", KT_INT, F(eval_batches), "0", 0, IMAX, NULL, 0,
     "global batches per validation pass; 0: the whole validation set"},
    {"train", "sample_tokens", KT_INT, F(sample_tokens), "0", 0, 1 << 24, NULL, 0,
     "tokens sampled with the job's tokenizer at the end of training (stopping at an eos); "
     "0: none"},
    {"train", "sample_prompt", KT_STRING, F(sample_prompt), "", NOLIM, NULL, 0,
     "the closing sample's prompt (encoded with data.tokenizer); empty: a newline"},
    {"train", "sample_temperature", KT_FLOAT, F(sample_temperature), "0.8", 0, 100, NULL, 0,
     "the closing sample's and generate's temperature; 0: greedy"},
    {"train", "sample_top_p", KT_FLOAT, F(sample_top_p), "0.9", 0, 1, NULL, KF_MIN_OPEN,
     "nucleus sampling: the smallest set of tokens whose probability reaches this"},
    /* 0: run to `steps`; N: stop after step N (saving a checkpoint when checkpoint.dir is
     * set), with the learning-rate schedule of `steps` */
    {"train", "stop_after", KT_INT, F(stop_after), "0", 0, IMAX, NULL, 0,
     "stop after this step, saving a checkpoint, with the schedule of train.steps; 0: run to "
     "train.steps"},
    /* a step whose loss or gradient norm is NaN or infinite never reaches the optimizer
     * (all ranks agree through the step's loss reduction): abort ends the run with an
     * error naming the step and saves nothing more; skip drops that step's update (no
     * weight, moment or AdamW step-count change; its data is consumed) and aborts after
     * more than max_skipped such steps in a row */
    {"train", "on_nonfinite", KT_ENUM, F(on_nonfinite), "abort", NOLIM, "abort|skip", 0,
     "a step whose loss or gradient norm is NaN or infinite is never applied: abort ends the "
     "run naming the step; skip drops its update and aborts after more than max_skipped in a "
     "row"},
    {"train", "max_skipped", KT_INT, F(max_skipped), "10", 1, IMAX, NULL, 0,
     "on_nonfinite = skip: at most this many non-finite steps in a row"},
    /* the recipe of the blocks' linear layers (src/fp8_linear.h); master weights, reduced
     * gradients, AdamW and checkpoints are the same in every recipe, so a resume may
     * change it */
    {"train", "matmul", KT_ENUM, F(matmul), "bf16", NOLIM, "bf16|fp8-tensorwise|fp8-rowwise", 0,
     "the transformer blocks' linear layers: bf16 (the backend's act dtype), or FP8 e4m3 "
     "forward with dynamic scales per tensor (gradients e5m2) or per row (gradients e4m3); "
     "the embedding and lm head stay bf16"},
    {"train", "fp8_fast_accum", KT_BOOL, F(fp8_fast_accum), "true", NOLIM, NULL, 0,
     "FP8 recipes: the forward products may sum at the tensor cores' reduced precision "
     "(cuBLASLt fast accumulation, as torchao's forward); dgrad and wgrad sum in fp32 either "
     "way"},

    /* [fsdp] */
    {"fsdp", "strategy", KT_ENUM, F(strategy), "FULL_SHARD", NOLIM,
     "FULL_SHARD|SHARD_GRAD_OP|NO_SHARD|HYBRID_SHARD", 0,
     "FULL_SHARD, SHARD_GRAD_OP (keep gathered from forward to backward), NO_SHARD "
     "(replicate), HYBRID_SHARD (shard in a node, replicate across nodes)"},
    {"fsdp", "param_dtype", KT_ENUM, F(param_dtype), "fp32", NOLIM, "fp32|bf16", 0,
     "dtype of the gathered parameters (fp32 master weights and moments stay)"},
    {"fsdp", "reduce_dtype", KT_ENUM, F(reduce_dtype), "fp32", NOLIM, "fp32|bf16", 0,
     "dtype of the gradient reductions"},
    {"fsdp", "prefetch", KT_BOOL, F(prefetch), "true", NOLIM, NULL, 0,
     "gather the next unit during the current one's compute"},
    {"fsdp", "fp8_all_gather", KT_BOOL, F(fp8_all_gather), "true", NOLIM, NULL, 0,
     "with train.matmul = fp8-tensorwise under FULL_SHARD or HYBRID_SHARD, the gather makes "
     "the blocks' weights e4m3 from the fp32 master (one scale per weight, from one amax "
     "pass per step): the codes quantizing the bf16 weights would give, at less traffic; "
     "false: gather bf16 and quantize in each product"},
    {"fsdp", "activation_checkpointing", KT_ENUM, F(activation_checkpointing), "none", NOLIM,
     "none|full|selective", 0,
     "none, selective (recompute norms, attention, SwiGLU) or full (recompute each block)"},
    {"fsdp", "shard_group_size", KT_INT, F(shard_group_size), "0", 0, 1 << 24, NULL, 0,
     "shard over blocks of this many ranks, replicate across them; 0: the strategy's group"},
    {"fsdp", "trace", KT_BOOL, F(trace), "false", NOLIM, NULL, 0,
     "write each rank's schedule to <run_dir>/trace.rank<R>.jsonl"},

    {"data", "train", KT_STRING, F(data_train), NULL, NOLIM, NULL,
     KF_REQUIRED | KF_TRAINING | KF_PATH,
     "the training token file (shardlm data prepare); not needed by eval and generate"},
    {"data", "val", KT_STRING, F(data_val), "", NOLIM, NULL, KF_PATH,
     "the validation token file; empty: none"},
    {"data", "shuffle", KT_BOOL, F(shuffle), "true", NOLIM, NULL, 0,
     "permute the training windows every epoch (from train.seed)"},
    {"data", "doc_mask", KT_BOOL, F(doc_mask), "false", NOLIM, NULL, 0,
     "packed documents attend only within themselves and a document's first token is no "
     "target (the token file's document starts); false: plain packing"},
    /* a tokenizer file or model directory (src/tokenizer.h), or bytes; default: the
     * model.init_from directory's when it holds one, else bytes */
    {"data", "tokenizer", KT_STRING, F(tokenizer), NULL, NOLIM, NULL, KF_PATH | KF_DERIVED,
     "a tokenizer file, a model directory or bytes; default: model.init_from's directory "
     "when it holds a tokenizer, else bytes"},

    /* [log] */
    {"log", "every", KT_INT, F(log_every), "1", 1, IMAX, NULL, 0,
     "steps between logged steps"},
    /* default: runs/<job file name without .ini>, relative to the working directory;
     * when the job file sets it, relative to the job file like every path in it */
    {"log", "run_dir", KT_STRING, F(run_dir), NULL, NOLIM, NULL, KF_DERIVED | KF_PATH,
     "where metrics.jsonl, summary.json (and traces) go; default runs/<job file name>"},
    /* MFU = model TFLOP/s per GPU / this; 0: the dense peak of the device's dtype from
     * src/device_table.c (n/a on the cpu backend and on a device the table lacks) */
    {"log", "peak_tflops", KT_FLOAT, F(peak_tflops), "0", 0, 1e6, NULL, 0,
     "the MFU denominator, dense TFLOP/s per device; 0: the device table's peak for the "
     "dtype in use (n/a on the cpu backend and on a device the table lacks)"},
    /* /metrics in Prometheus's text format from each node's local rank 0: PORT (on
     * 127.0.0.1), ADDR:PORT or [ADDR6]:PORT; empty: no server */
    {"log", "prometheus", KT_STRING, F(prometheus), "", NOLIM, NULL, 0,
     "serve /metrics (Prometheus text format) from each node's local rank 0 at PORT "
     "(127.0.0.1), ADDR:PORT or [ADDR6]:PORT; empty: no server"},
    /* the same metrics written to DIR/shardlm_<job>_<host>.prom for node_exporter's
     * textfile collector (atomic rename, at most once a second; removed at the end) */
    {"log", "prometheus_textfile", KT_STRING, F(prometheus_textfile), "", NOLIM, NULL, KF_PATH,
     "write the same metrics to DIR/shardlm_<job>_<host>.prom for node_exporter's textfile "
     "collector; empty: none"},
    /* GPU telemetry through NVML, sampled on a thread every N ms; 0: off */
    {"log", "telemetry_interval_ms", KT_INT, F(telemetry_interval_ms), "500", 0, 60000, NULL, 0,
     "NVML sampling period of the GPU telemetry, ms (0: off; else at least 10)"},

    /* [checkpoint]: <dir>/step_<N>.h5, <dir>/latest (docs/ARCHITECTURE.md "Checkpoints") */
    {"checkpoint", "dir", KT_STRING, F(ckpt_dir), "", NOLIM, NULL, KF_PATH,
     "where step_<N>.h5 and latest go; empty: no checkpoints, and the trained weights are "
     "not kept"},
    {"checkpoint", "every", KT_INT, F(ckpt_every), "0", 0, IMAX, NULL, 0,
     "save every N steps (and at the end); 0: only at the end"},
    {"checkpoint", "keep", KT_INT, F(ckpt_keep), "0", 0, IMAX, NULL, 0,
     "keep the newest K checkpoints; 0: all"},
    /* auto: <dir>/latest when it exists; none; or a checkpoint file or directory */
    {"checkpoint", "resume", KT_STRING, F(ckpt_resume), "auto", NOLIM, NULL, KF_PATH,
     "auto (checkpoint.dir's latest when there is one), none, or a checkpoint file or directory"},
    /* a resume refuses a job whose train.steps, global_batch or seq_len differ from the
     * checkpoint's unless the change is allowed here. steps: the learning rate continues
     * from the checkpoint's lr_last and decays (cosine) to min_lr at the new last step
     * (warm-up, if not over, is kept). global_batch: the data position, a global sample
     * index, stays valid: the next step takes the next global_batch samples. seq_len:
     * the position is re-expressed in tokens (the first window of the new length that
     * starts at or after the first unread token); refused for shuffled data, whose
     * order of windows of another length has no common place with the old one */
    {"checkpoint", "allow_steps_change", KT_BOOL, F(allow_steps_change), "false", NOLIM, NULL, 0,
     "a resume may change train.steps: the rate continues from the checkpoint's and decays "
     "to min_lr at the new last step"},
    {"checkpoint", "allow_global_batch_change", KT_BOOL, F(allow_global_batch_change), "false",
     NOLIM, NULL, 0,
     "a resume may change train.global_batch: the next step starts at the checkpoint's sample"},
    {"checkpoint", "allow_seq_len_change", KT_BOOL, F(allow_seq_len_change), "false", NOLIM,
     NULL, 0,
     "a resume may change train.seq_len: the position is re-expressed in tokens (unshuffled "
     "data only)"},
    /* how a save writes (io/ckpt_hdf5.h; benchmarks/RESULTS.md measures them); reads take
     * direct I/O wherever the file system allows it */
    {"checkpoint", "direct_io", KT_BOOL, F(ckpt_direct_io), "true", NOLIM, NULL, 0,
     "saves write each rank's bytes with O_DIRECT (falling back to MPI-IO where the file "
     "system refuses it); false: H5Dwrite through MPI-IO"},
    {"checkpoint", "collective_io", KT_BOOL, F(ckpt_collective_io), "false", NOLIM, NULL, 0,
     "saves through MPI-IO use collective buffering (two-phase I/O) instead of each rank "
     "writing its own bytes"},
    {"checkpoint", "alignment", KT_INT, F(ckpt_alignment), "1048576", 0, 1 << 30, NULL, 0,
     "datasets of at least this many bytes start at a multiple of it (file-system block or "
     "stripe); 0: HDF5's packing"},

    /* [runtime] */
    {"runtime", "backend", KT_ENUM, F(backend), "auto", NOLIM, "auto|cpu|cuda", 0,
     "auto (cuda where this build's kernels run on the GPU, else cpu, saying why when a GPU "
     "is there), cpu or cuda (refused, naming the device, where it cannot run)"},
    {"runtime", "threads", KT_INT, F(threads), "0", 0, 4096, NULL, 0,
     "CPU threads per rank; 0: cores / ranks on the node"},
    /* kernels/comm_watchdog.h: both comm backends and the host reductions of a step */
    {"runtime", "comm_timeout_s", KT_FLOAT, F(comm_timeout_s), "600", 0, 1e7, NULL, KF_MIN_OPEN,
     "a collective unfinished this many seconds after its issue ends the job, naming the "
     "ranks that did not arrive"},
    {"runtime", "ranks_per_node", KT_INT, F(ranks_per_node), "0", 0, 1 << 24, NULL, 0,
     "make blocks of this many ranks act as nodes (HYBRID_SHARD on one machine, tests); 0: "
     "real nodes"},
    {"runtime", "comm_delay_us", KT_INT, F(comm_delay_us), "0", 0, 60000000, NULL, 0,
     "benchmarks only: every collective takes at least this long"},
    {"runtime", "profile", KT_BOOL, F(profile), "false", NOLIM, NULL, 0,
     "time every op (synchronising) and print where a step's time goes"},

    /* [cuda]: the cuda backend's options (its init, kernels/ops.h) */
    {"cuda", "attention", KT_ENUM, F(cuda_attention), "sm90", NOLIM, "sm90|mma_sync", 0,
     "sm90: the Hopper wgmma attention kernels where they apply (head_dim 64 or 128, compute "
     "capability 9.0), the portable mma.sync ones elsewhere; mma_sync: those alone"},

    /* [nccl]: the nccl backend's options (its init, kernels/comm.h) */
    {"nccl", "cta_policy", KT_ENUM, F(nccl_cta_policy), "default", NOLIM, "default|efficiency",
     0,
     "efficiency: NCCL's kernels use as few SMs as keep them decent, leaving more to the "
     "matmuls they overlap (NCCL 2.27 and later; older NCCL keeps its default)"},
    {"nccl", "copy_engine_allgather", KT_BOOL, F(nccl_copy_engine_allgather), "true", NOLIM,
     NULL, 0,
     "all-gathers into registered buffers run on the GPUs' copy engines, leaving the SMs to "
     "compute (NCCL 2.28 and later); false: NCCL's SM kernels"},
};
#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

/* KT_ENUM stores the choice's index: each choices list above is in its enum's order */
_Static_assert(NONFINITE_ABORT == 0 && NONFINITE_SKIP == 1, "train.on_nonfinite");
_Static_assert(MODEL_MATMUL_BF16 == 0 && MODEL_MATMUL_FP8_TENSORWISE == 1 &&
                   MODEL_MATMUL_FP8_ROWWISE == 2, "train.matmul");
_Static_assert(FSDP_FULL_SHARD == 0 && FSDP_SHARD_GRAD_OP == 1 && FSDP_NO_SHARD == 2 &&
                   FSDP_HYBRID_SHARD == 3, "fsdp.strategy");
_Static_assert(SHLM_F32 == 0 && SHLM_BF16 == 1, "fsdp.param_dtype, fsdp.reduce_dtype");
_Static_assert(LLAMA_AC_NONE == 0 && LLAMA_AC_FULL == 1 && LLAMA_AC_SELECTIVE == 2,
               "fsdp.activation_checkpointing");
_Static_assert(SHLM_BACKEND_AUTO == 0 && SHLM_BACKEND_CPU == 1 && SHLM_BACKEND_CUDA == 2,
               "runtime.backend");
_Static_assert(SHLM_ATTENTION_SM90 == 0 && SHLM_ATTENTION_MMA_SYNC == 1, "cuda.attention");
_Static_assert(SHLM_NCCL_CTA_DEFAULT == 0 && SHLM_NCCL_CTA_EFFICIENCY == 1, "nccl.cta_policy");
_Static_assert(sizeof(fsdp_strategy) == sizeof(int) && sizeof(shlm_dtype) == sizeof(int) &&
                   sizeof(llama_ac) == sizeof(int) && sizeof(nonfinite_policy) == sizeof(int) &&
                   sizeof(model_matmul) == sizeof(int) &&
                   sizeof(shlm_backend_choice) == sizeof(int) &&
                   sizeof(shlm_attention_kernels) == sizeof(int) &&
                   sizeof(shlm_nccl_cta_policy) == sizeof(int),
               "KT_ENUM fields are int-sized");

static const char *const sections[] = {"model", "train", "fsdp", "data", "log", "checkpoint",
                                       "runtime", "cuda", "nccl"};
#define N_SECTIONS ((int)(sizeof sections / sizeof sections[0]))

/* Where a key's value came from, for messages. */
typedef struct key_state {
    int set;      /* 0: default (or preset / derived) */
    int line;     /* > 0: line of the job file; 0 with set: a --set override */
    char *value;  /* the raw text, parsed again when the config is resolved */
} key_state;

typedef struct loader {
    job_config *cfg;
    key_state st[N_KEYS];
    const char *set_arg; /* the --set argument being applied, NULL while in the file */
} loader;

/* A value as shown in a message: at most 60 characters, control characters as '?',
 * so an error stays one line whatever was typed. */
static const char *show(const char *v, char buf[72]) {
    size_t n = 0;
    for (; v[n] && n < 60; n++) buf[n] = iscntrl((unsigned char)v[n]) ? '?' : v[n];
    strcpy(buf + n, v[n] ? "..." : "");
    return buf;
}

/* ---- finding keys ---- */

static int find_key(const char *section, const char *key) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].section, section) == 0 && strcmp(keys[i].key, key) == 0) return i;
    return -1;
}

static int known_section(const char *s) {
    for (int i = 0; i < N_SECTIONS; i++)
        if (strcmp(sections[i], s) == 0) return 1;
    return 0;
}

/* Edit distance with adjacent transpositions (optimal string alignment), for "did you
 * mean": typos are mostly one dropped, doubled or swapped letter. */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb];
}

/* " (did you mean ...?)" for an unknown key, or "" when nothing is close. */
static void suggest_key(const char *section, const char *key, char *out, size_t outlen) {
    out[0] = '\0';
    int best = -1, best_d = 3;
    for (int i = 0; i < N_KEYS; i++) {
        if (strcmp(keys[i].section, section) != 0) continue;
        int d = edit_distance(key, keys[i].key);
        if (d < best_d) best_d = d, best = i;
    }
    if (best >= 0) {
        snprintf(out, outlen, " (did you mean '%s'?)", keys[best].key);
        return;
    }
    /* the right key in the wrong section */
    for (int i = 0; i < N_KEYS; i++) {
        if (strcmp(keys[i].key, key) == 0) {
            snprintf(out, outlen, " (it belongs in [%s])", keys[i].section);
            return;
        }
    }
}

/* ---- values ---- */

/* Strips surrounding double quotes and decodes \" \\ \n \t inside them. */
static int unquote(const char *v, char *out, size_t outlen, char *why, size_t whylen) {
    size_t len = strlen(v);
    if (len < 2 || v[0] != '"' || v[len - 1] != '"') {
        if (len >= outlen) {
            io_set_err(why, whylen, "longer than %zu characters", outlen - 1);
            return -1;
        }
        memcpy(out, v, len + 1);
        return 0;
    }
    size_t n = 0;
    for (size_t i = 1; i < len - 1; i++) {
        char c = v[i];
        if (c == '\\') {
            char e = i + 1 < len - 1 ? v[++i] : '\0';
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e == '"' ? '"' : e == '\\' ? '\\' : 0;
            if (!c) {
                io_set_err(why, whylen, "bad escape '\\%c' (use \\\" \\\\ \\n \\t)", e ? e : ' ');
                return -1;
            }
        }
        if (n + 1 >= outlen) {
            io_set_err(why, whylen, "longer than %zu characters", outlen - 1);
            return -1;
        }
        out[n++] = c;
    }
    out[n] = '\0';
    return 0;
}

static void range_text(const key_def *k, char *out, size_t outlen) {
    int inf = (k->type == KT_INT && k->max >= IMAX) || (k->type == KT_FLOAT && k->max >= FMAX);
    /* %.15g: integer bounds in full (1048576, not 1.04858e+06) */
    if (inf)
        snprintf(out, outlen, "must be %s %.15g", k->flags & KF_MIN_OPEN ? ">" : ">=", k->min);
    else
        snprintf(out, outlen, "must be in %c%.15g, %.15g%c", k->flags & KF_MIN_OPEN ? '(' : '[',
                 k->min, k->max, k->flags & KF_MAX_OPEN ? ')' : ']');
}

static int in_range(const key_def *k, double v) {
    if (k->flags & KF_MIN_OPEN ? !(v > k->min) : !(v >= k->min)) return 0;
    if (k->flags & KF_MAX_OPEN ? !(v < k->max) : !(v <= k->max)) return 0;
    return 1;
}

/* Parses `v` as key k's type into cfg's field. On error writes the reason ("not an
 * integer", "must be in [0, 1)", ...) into why and returns -1, leaving cfg alone. */
static int parse_value(const key_def *k, const char *v, job_config *cfg, char *why,
                       size_t whylen) {
    char *field = (char *)cfg + k->offset;
    char *end;
    char range[96];
    errno = 0;
    switch (k->type) {
    case KT_INT: {
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || isspace((unsigned char)*v)) {
            io_set_err(why, whylen, "not an integer");
            return -1;
        }
        const int overflow = errno == ERANGE || x < INT_MIN || x > INT_MAX;
        if (overflow && (x > 0 ? k->max >= IMAX : k->min <= -IMAX)) {
            /* a key bounded on that side only by the int it is stored in: say that bound */
            io_set_err(why, whylen, "out of range, must be at %s %d (the %s integer a key holds)",
                       x > 0 ? "most" : "least", x > 0 ? INT_MAX : INT_MIN,
                       x > 0 ? "largest" : "smallest");
            return -1;
        }
        if (overflow || !in_range(k, (double)x)) {
            range_text(k, range, sizeof range);
            io_set_err(why, whylen, "out of range, %s", range);
            return -1;
        }
        *(int *)field = (int)x;
        return 0;
    }
    case KT_FLOAT: {
        double x = strtod(v, &end);
        if (end == v || *end || isspace((unsigned char)*v) || isnan(x) || isinf(x) ||
            strpbrk(v, "xX")) { /* no hex floats, nan or inf in a job file */
            io_set_err(why, whylen, "not a number");
            return -1;
        }
        /* the range applies to the float that is stored: 1e-50 would be stored as 0 */
        float f = (float)x;
        if (fabs(x) > FLT_MAX || !in_range(k, (double)f)) {
            range_text(k, range, sizeof range);
            io_set_err(why, whylen, "out of range, %s", range);
            return -1;
        }
        *(float *)field = f;
        return 0;
    }
    case KT_U64: {
        int hex = v[0] == '0' && (v[1] == 'x' || v[1] == 'X');
        unsigned long long x = strtoull(v, &end, hex ? 16 : 10);
        if (end == v || *end || !isdigit((unsigned char)v[0]) || (hex && end == v + 2)) {
            io_set_err(why, whylen, "not an unsigned integer");
            return -1;
        }
        if (errno == ERANGE) {
            io_set_err(why, whylen, "out of range, must be < 2^64");
            return -1;
        }
        *(uint64_t *)field = (uint64_t)x;
        return 0;
    }
    case KT_BOOL: {
        static const char *const yes[] = {"true", "yes", "on", "1"};
        static const char *const no[] = {"false", "no", "off", "0"};
        for (int i = 0; i < 4; i++) {
            if (strcasecmp(v, yes[i]) == 0) return *(int *)field = 1, 0;
            if (strcasecmp(v, no[i]) == 0) return *(int *)field = 0, 0;
        }
        io_set_err(why, whylen, "not a boolean (true or false)");
        return -1;
    }
    case KT_STRING: {
        char buf[1024];
        if (unquote(v, buf, k->size < sizeof buf ? k->size : sizeof buf, why, whylen) != 0)
            return -1;
        if (k->flags & KF_PRESET && buf[0]) {
            llama_config probe;
            if (llama_preset(buf, &probe) != 0) {
                io_set_err(why, whylen, "unknown preset (known: %s)", llama_preset_names());
                return -1;
            }
        }
        memcpy(field, buf, strlen(buf) + 1);
        return 0;
    }
    case KT_ENUM: {
        size_t n = strlen(v);
        int index = 0;
        for (const char *c = k->choices; *c; index++) {
            size_t len = strcspn(c, "|");
            if (len == n && strncmp(c, v, n) == 0) {
                *(int *)field = index;
                return 0;
            }
            c += len + (c[len] == '|');
        }
        io_set_err(why, whylen, "not one of %s", k->choices);
        return -1;
    }
    }
    io_set_err(why, whylen, "internal error: bad key type");
    return -1;
}

/* The index-th word of a choices list, into out ("?" past its end). */
static const char *choice_word(const char *choices, int index, char *out, size_t outlen) {
    const char *c = choices;
    for (int i = 0; *c && i < index; i++) c += strcspn(c, "|") + (c[strcspn(c, "|")] == '|');
    size_t len = strcspn(c, "|");
    if (index < 0 || !*c) len = 0;
    snprintf(out, outlen, "%.*s", (int)len, len ? c : "?");
    return out;
}

static void format_value(const key_def *k, const job_config *cfg, char *out, size_t outlen) {
    const char *field = (const char *)cfg + k->offset;
    switch (k->type) {
    case KT_INT: snprintf(out, outlen, "%d", *(const int *)field); break;
    case KT_FLOAT: snprintf(out, outlen, "%g", *(const float *)field); break;
    case KT_U64: snprintf(out, outlen, "%llu", (unsigned long long)*(const uint64_t *)field); break;
    case KT_BOOL: snprintf(out, outlen, "%s", *(const int *)field ? "true" : "false"); break;
    case KT_ENUM: choice_word(k->choices, *(const int *)field, out, outlen); break;
    case KT_STRING: {
        /* quote only what would not read back as itself */
        const char *s = field;
        int plain = s[0] && !isspace((unsigned char)s[0]) && !isspace((unsigned char)s[strlen(s) - 1]) &&
                    s[0] != '"' && !strpbrk(s, "\n\t;");
        if (plain) {
            snprintf(out, outlen, "%s", s);
        } else {
            size_t n = 0;
            if (n + 1 < outlen) out[n++] = '"';
            for (; *s && n + 3 < outlen; s++) {
                char esc = *s == '\n' ? 'n' : *s == '\t' ? 't' : *s == '"' ? '"' : *s == '\\' ? '\\' : 0;
                if (esc) out[n++] = '\\', out[n++] = esc;
                else out[n++] = *s;
            }
            if (n + 1 < outlen) out[n++] = '"';
            out[n] = '\0';
        }
        break;
    }
    }
}

/* ---- origins, for messages: "FILE:LINE", "--set section.key" or just "FILE" ---- */

static void origin(const loader *ld, int i, char *out, size_t outlen) {
    const key_state *s = &ld->st[i];
    if (s->set && s->line > 0)
        snprintf(out, outlen, "%s:%d", ld->cfg->path, s->line);
    else if (s->set)
        snprintf(out, outlen, "--set %s.%s", keys[i].section, keys[i].key);
    else
        snprintf(out, outlen, "%s", ld->cfg->path);
}

/* The origin of a check between keys a and b: the first one the job set. */
static void origin2(const loader *ld, int a, int b, char *out, size_t outlen) {
    origin(ld, ld->st[a].set || !ld->st[b].set ? a : b, out, outlen);
}

/* ---- entries (file lines and --set overrides) ---- */

/* The message prefix of the entry being applied. */
static void here(const loader *ld, const char *section, const char *key, int line, char *out,
                 size_t outlen) {
    char shown_section[72], shown_key[72];
    if (ld->set_arg)
        snprintf(out, outlen, "--set %s.%s", show(section, shown_section),
                 show(key ? key : "", shown_key));
    else
        snprintf(out, outlen, "%s:%d", ld->cfg->path, line);
}

static int on_entry(void *user, const char *section, const char *key, const char *value,
                    int line, char *err, size_t errlen) {
    loader *ld = user;
    char at[1100], shown[72], hint[96] = "";
    here(ld, section, key, line, at, sizeof at);

    if (!known_section(section)) {
        if (!section[0] && key) {
            for (int i = 0; i < N_KEYS; i++)
                if (strcmp(keys[i].key, key) == 0) {
                    snprintf(hint, sizeof hint, " (put it under [%s])", keys[i].section);
                    break;
                }
            io_set_err(err, errlen, "%s: key '%s' is outside any section%s", at, show(key, shown),
                    hint);
            return -1;
        }
        for (int i = 0; i < N_SECTIONS; i++)
            if (edit_distance(section, sections[i]) <= 2) {
                snprintf(hint, sizeof hint, "did you mean [%s]? ", sections[i]);
                break;
            }
        char known[128] = "";
        for (int i = 0; i < N_SECTIONS; i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? " " : "",
                     sections[i]);
        io_set_err(err, errlen, "%s: unknown section [%s] (%sknown: %s)", at, show(section, shown),
                hint, known);
        return -1;
    }
    if (!key) return 0; /* a section header */

    int i = find_key(section, key);
    if (i < 0) {
        suggest_key(section, key, hint, sizeof hint);
        io_set_err(err, errlen, "%s: unknown key '%s' in [%s]%s", at, show(key, shown), section,
                hint);
        return -1;
    }
    key_state *s = &ld->st[i];
    /* a --set may override the file once; the same key twice in one place is a mistake */
    if (s->set && (s->line > 0) == !ld->set_arg) {
        if (s->line > 0)
            io_set_err(err, errlen, "%s: duplicate key '%s' in [%s] (first set on line %d)", at,
                    key, section, s->line);
        else
            io_set_err(err, errlen, "%s: given twice", at);
        return -1;
    }

    job_config scratch;
    char why[512];
    if (parse_value(&keys[i], value, &scratch, why, sizeof why) != 0) {
        io_set_err(err, errlen, "%s: [%s] %s = '%s': %s", at, section, key, show(value, shown),
                why);
        return -1;
    }
    char *copy = strdup(value);
    if (!copy) {
        io_set_err(err, errlen, "%s: out of memory", at);
        return -1;
    }
    free(s->value);
    s->value = copy;
    s->set = 1;
    s->line = ld->set_arg ? 0 : line;
    return 0;
}

/* Applies one "section.key=value" override. */
static int apply_override(loader *ld, const char *arg, char *err, size_t errlen) {
    char shown[72];
    const char *eq = strchr(arg, '=');
    const char *dot = strchr(arg, '.');
    if (!eq || !dot || dot > eq) {
        io_set_err(err, errlen, "--set '%s': expected section.key=value", show(arg, shown));
        return -1;
    }
    /* a copy as long as the argument: the value's own limit (a path's 1023 characters)
     * is what a long one runs into, with that key's message */
    char *buf = strdup(arg);
    if (!buf) {
        io_set_err(err, errlen, "--set '%s': out of memory", show(arg, shown));
        return -1;
    }
    /* trim blanks around the section, the key and the value, like the file parser */
    char *section = buf, *key = buf + (dot - arg) + 1, *value = buf + (eq - arg) + 1;
    key[-1] = '\0';
    value[-1] = '\0';
    char *parts[3] = {section, key, value};
    for (int p = 0; p < 3; p++) {
        char *s = parts[p];
        while (isspace((unsigned char)*s)) s++;
        size_t n = strlen(s);
        while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
        parts[p] = s;
    }
    ld->set_arg = arg;
    int rc = on_entry(ld, parts[0], parts[1], parts[2], 0, err, errlen);
    ld->set_arg = NULL;
    free(buf);
    return rc;
}

/* ---- resolution: defaults, preset, explicit values, derived values, checks ---- */

static int idx(const char *section, const char *key) {
    int i = find_key(section, key);
    if (i < 0) abort(); /* a misspelt key in this file: a programming error */
    return i;
}

/* A path of the job file (field as written there) relative to the job file's directory,
 * into out: an absolute path, an empty one or a job file without a directory part
 * leave it as it is. Returns its length (snprintf's: >= outlen when it does not fit). */
static int join_job_dir(const char *job_path, const char *field, char *out, size_t outlen) {
    const char *slash = strrchr(job_path, '/');
    if (!field[0] || field[0] == '/' || !slash) return snprintf(out, outlen, "%s", field);
    return snprintf(out, outlen, "%.*s/%s", (int)(slash - job_path), job_path, field);
}

/* model.init_from as the run will see it (relative to the job file when set there),
 * before the other keys are resolved: the architecture may come from it. */
static int init_from_path(const loader *ld, char *out, size_t outlen, char *err,
                          size_t errlen) {
    const int i = idx("model", "init_from");
    job_config scratch;
    char why[512], at[1100];
    parse_value(&keys[i], ld->st[i].value, &scratch, why, sizeof why); /* checked when read */
    const char *field = (const char *)&scratch + keys[i].offset;
    int n = ld->st[i].line > 0 ? join_job_dir(ld->cfg->path, field, out, outlen)
                               : snprintf(out, outlen, "%s", field);
    if (n < 0 || (size_t)n >= outlen) {
        origin(ld, i, at, sizeof at);
        io_set_err(err, errlen, "%s: [model] init_from: path longer than %zu characters once "
                "joined to the job file's directory", at, outlen - 1);
        return -1;
    }
    return 0;
}

/* The architecture in DIR/config.json as a shardlm shape (init_std, which a config.json
 * does not hold, the key's default). */
static int model_from_hf(const char *dir, llama_config *m, char *err, size_t errlen) {
    hf_config h;
    if (hf_config_read(dir, &h, err, errlen) != 0) return -1;
    if (h.head_dim != h.hidden_size / h.num_attention_heads) {
        io_set_err(err, errlen, "%s/config.json: head_dim = %d, but shardlm's is hidden_size / "
                "num_attention_heads = %d", dir, h.head_dim, h.hidden_size / h.num_attention_heads);
        return -1;
    }
    *m = (llama_config){.dim = h.hidden_size, .n_layers = h.num_hidden_layers,
                        .n_heads = h.num_attention_heads, .n_kv_heads = h.num_key_value_heads,
                        .head_dim = h.head_dim, .ffn_dim = h.intermediate_size,
                        .vocab_size = h.vocab_size, .max_seq_len = h.max_position_embeddings,
                        .norm_eps = (float)h.rms_norm_eps, .rope_theta = (float)h.rope_theta,
                        .tie_word_embeddings = h.tie_word_embeddings};
    char why[512];
    job_config scratch;
    const int i_std = idx("model", "init_std");
    parse_value(&keys[i_std], keys[i_std].def, &scratch, why, sizeof why);
    m->init_std = scratch.model.init_std;
    if (llama_config_validate(m, why, sizeof why) != 0) {
        io_set_err(err, errlen, "%s/config.json: %s", dir, why);
        return -1;
    }
    return 0;
}

/* The [model] keys whose value a config.json gives, and its names for them. */
static const struct {
    const char *key, *hf;
} hf_names[] = {{"dim", "hidden_size"},
                {"n_layers", "num_hidden_layers"},
                {"n_heads", "num_attention_heads"},
                {"n_kv_heads", "num_key_value_heads"},
                {"ffn_dim", "intermediate_size"},
                {"vocab_size", "vocab_size"},
                {"max_seq_len", "max_position_embeddings"},
                {"norm_eps", "rms_norm_eps"},
                {"rope_theta", "rope_theta"},
                {"tie_word_embeddings", "tie_word_embeddings"}};

/* Every [model] key the job gives (set, or through its preset) must hold the value of
 * init_from's config.json: all those that differ, in one message naming both values, where
 * the job's comes from, and the file. */
static int check_against_hf(const loader *ld, int have_preset, const llama_config *hf,
                            const char *dir, char *err, size_t errlen) {
    const job_config *c = ld->cfg;
    job_config theirs;
    theirs.model = *hf;
    char list[1400] = "", mine[64], their[64], at[200];
    int n = 0;
    for (size_t k = 0; k < sizeof hf_names / sizeof hf_names[0]; k++) {
        const int i = idx("model", hf_names[k].key);
        if (!ld->st[i].set && !have_preset) continue;
        const char *a = (const char *)c + keys[i].offset;
        const char *b = (const char *)&theirs + keys[i].offset;
        const int same = keys[i].type == KT_FLOAT
                             ? fabsf(*(const float *)a - *(const float *)b) <=
                                   1e-6f * fabsf(*(const float *)b)
                             : *(const int *)a == *(const int *)b;
        if (same) continue;
        format_value(&keys[i], c, mine, sizeof mine);
        format_value(&keys[i], &theirs, their, sizeof their);
        if (ld->st[i].set) origin(ld, i, at, sizeof at);
        else snprintf(at, sizeof at, "preset %s", c->preset);
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s = %s (%s) but %s = %s", n++ ? "; " : "",
                 keys[i].key, mine, at, hf_names[k].hf, their);
    }
    if (!n) return 0;
    io_set_err(err, errlen, "%s: [model] disagrees with %s/config.json (model.init_from): %s; "
            "leave [model] out to take the architecture from config.json", c->path, dir, list);
    return -1;
}

static int resolve(loader *ld, char *err, size_t errlen) {
    job_config *c = ld->cfg;
    const key_state *st = ld->st;
    char at[1100];

    /* defaults: the table's text, through the same parser as a job file's values */
    char why[512];
    for (int i = 0; i < N_KEYS; i++) {
        if (keys[i].def && !(keys[i].flags & KF_MODEL) &&
            parse_value(&keys[i], keys[i].def, c, why, sizeof why) != 0) {
            io_set_err(err, errlen, "internal error: default of %s.%s: %s", keys[i].section,
                    keys[i].key, why);
            return -1;
        }
    }

    /* the model: from model.init_from's config.json when it is a Hugging Face directory,
     * else a preset, else every shape key must be given */
    const int i_init = idx("model", "init_from");
    char init_path[1024] = "";
    llama_config hf;
    if (st[i_init].set && init_from_path(ld, init_path, sizeof init_path, err, errlen) != 0)
        return -1;
    if (init_path[0]) {
        char why2[1536];
        int kind = hf_source_kind(init_path, why2, sizeof why2);
        if (kind < 0 || (kind == HF_SOURCE_HF_DIR &&
                         model_from_hf(init_path, &hf, why2, sizeof why2) != 0)) {
            origin(ld, i_init, at, sizeof at);
            io_set_err(err, errlen, "%s: [model] init_from: %s", at, why2);
            return -1;
        }
        c->hf_model = kind == HF_SOURCE_HF_DIR;
    }
    int i_preset = idx("model", "preset");
    int have_preset = st[i_preset].set && st[i_preset].value[0];
    if (have_preset) {
        parse_value(&keys[i_preset], st[i_preset].value, c, why, sizeof why);
        llama_preset(c->preset, &c->model);
    } else if (!c->hf_model) {
        char missing[256] = "", all[256] = "";
        for (int i = 0; i < N_KEYS; i++) {
            if (!(keys[i].flags & KF_SHAPE)) continue;
            size_t n = strlen(all);
            snprintf(all + n, sizeof all - n, "%s%s", n ? ", " : "", keys[i].key);
            if (st[i].set) continue;
            n = strlen(missing);
            snprintf(missing + n, sizeof missing - n, "%s%s", n ? ", " : "", keys[i].key);
        }
        if (missing[0]) {
            io_set_err(err, errlen,
                    "%s: [model] needs a preset (%s), all of %s, or init_from a Hugging Face "
                    "directory; missing: %s", c->path, llama_preset_names(), all, missing);
            return -1;
        }
    }
    if (!have_preset)
        for (int i = 0; i < N_KEYS; i++)
            if (keys[i].flags & KF_MODEL && keys[i].def)
                parse_value(&keys[i], keys[i].def, c, why, sizeof why);

    /* what the job says, over the defaults (already validated when read) */
    for (int i = 0; i < N_KEYS; i++)
        if (st[i].set) parse_value(&keys[i], st[i].value, c, why, sizeof why);
    c->seq_len_given = st[idx("train", "seq_len")].set;

    /* a Hugging Face model's architecture is its config.json's: what the job says of it
     * must agree (init_std, which no config.json holds, stays the job's) */
    if (c->hf_model) {
        if (check_against_hf(ld, have_preset, &hf, init_path, err, errlen) != 0) return -1;
        hf.init_std = c->model.init_std;
        c->model = hf;
    }

    /* required keys (an empty string, quoted or not, counts as missing); a forward-only
     * use needs none of the training ones */
    for (int i = 0; i < N_KEYS; i++) {
        const char *field = (const char *)c + keys[i].offset;
        if (keys[i].flags & KF_TRAINING && c->use != JOB_TRAIN) continue;
        if (keys[i].flags & KF_REQUIRED &&
            (!st[i].set || (keys[i].type == KT_STRING && !field[0]))) {
            io_set_err(err, errlen, "%s: [%s] %s is required", c->path, keys[i].section,
                    keys[i].key);
            return -1;
        }
    }

    /* derived defaults */
    const int i_kv = idx("model", "n_kv_heads"), i_msl = idx("model", "max_seq_len");
    const int i_gb = idx("train", "global_batch"), i_min_lr = idx("train", "min_lr");
    const int i_run_dir = idx("log", "run_dir");
    const int own_shape = !have_preset && !c->hf_model; /* the shape is the job's keys */
    if (own_shape && !st[i_kv].set) c->model.n_kv_heads = c->model.n_heads;
    if (own_shape && !st[i_msl].set) {
        if (!c->seq_len_given) { /* a forward-only job: one of the two says the context */
            io_set_err(err, errlen, "%s: [train] seq_len or [model] max_seq_len is required",
                    c->path);
            return -1;
        }
        c->model.max_seq_len = c->seq_len;
    }
    if (!c->seq_len_given) c->seq_len = c->model.max_seq_len;
    if (!st[i_min_lr].set) c->min_lr = c->lr / 10;
    if (!st[i_run_dir].set) {
        const char *base = strrchr(c->path, '/');
        base = base ? base + 1 : c->path;
        size_t n = strlen(base);
        if (n > 4 && strcmp(base + n - 4, ".ini") == 0) n -= 4;
        snprintf(c->run_dir, sizeof c->run_dir, "runs/%.*s", (int)n, base);
    }

    /* cross-key checks */
    const int i_dim = idx("model", "dim"), i_nh = idx("model", "n_heads");
    const int i_seq = idx("train", "seq_len"), i_mb = idx("train", "micro_batch");
    const int i_lr = idx("train", "lr"), i_warm = idx("train", "warmup_steps");
    const int i_steps = idx("train", "steps");
    const llama_config *m = &c->model;
    if (m->dim % m->n_heads != 0) {
        origin2(ld, i_dim, i_nh, at, sizeof at);
        io_set_err(err, errlen, "%s: [model] dim = %d is not divisible by n_heads = %d", at,
                m->dim, m->n_heads);
        return -1;
    }
    if (m->n_heads % m->n_kv_heads != 0) {
        origin2(ld, i_kv, i_nh, at, sizeof at);
        io_set_err(err, errlen, "%s: [model] n_kv_heads = %d does not divide n_heads = %d", at,
                m->n_kv_heads, m->n_heads);
        return -1;
    }
    c->model.head_dim = m->dim / m->n_heads;
    if (c->seq_len > m->max_seq_len) {
        origin2(ld, i_seq, i_msl, at, sizeof at);
        io_set_err(err, errlen, "%s: [train] seq_len = %d is larger than [model] max_seq_len = %d",
                at, c->seq_len, m->max_seq_len);
        return -1;
    }
    if (c->global_batch > 0 && c->global_batch % c->micro_batch != 0) {
        origin2(ld, i_gb, i_mb, at, sizeof at);
        io_set_err(err, errlen,
                "%s: [train] global_batch = %d is not a multiple of micro_batch = %d", at,
                c->global_batch, c->micro_batch);
        return -1;
    }
    if (c->min_lr > c->lr) {
        origin2(ld, i_min_lr, i_lr, at, sizeof at);
        io_set_err(err, errlen, "%s: [train] min_lr = %g is larger than lr = %g", at, c->min_lr,
                c->lr);
        return -1;
    }
    /* the schedule's checks only where there is one (a forward-only job may have none) */
    const int schedule = st[i_steps].set || c->use == JOB_TRAIN;
    if (schedule && c->warmup_steps > c->steps) {
        origin2(ld, i_warm, i_steps, at, sizeof at);
        io_set_err(err, errlen, "%s: [train] warmup_steps = %d is more than steps = %d", at,
                c->warmup_steps, c->steps);
        return -1;
    }
    const int i_stop = idx("train", "stop_after"), i_every = idx("checkpoint", "every");
    if (schedule && c->stop_after > c->steps) {
        origin2(ld, i_stop, i_steps, at, sizeof at);
        io_set_err(err, errlen, "%s: [train] stop_after = %d is more than steps = %d", at,
                c->stop_after, c->steps);
        return -1;
    }
    if (c->ckpt_every > 0 && !c->ckpt_dir[0]) {
        origin(ld, i_every, at, sizeof at);
        io_set_err(err, errlen, "%s: [checkpoint] every = %d needs [checkpoint] dir", at,
                c->ckpt_every);
        return -1;
    }
    /* the exporter's address, read as prom_start will (one copy of the rule) */
    char host[256], port[16], why3[256];
    if (c->prometheus[0] && prom_parse_listen(c->prometheus, host, sizeof host, port,
                                              sizeof port, why3, sizeof why3) != 0) {
        origin(ld, idx("log", "prometheus"), at, sizeof at);
        io_set_err(err, errlen, "%s: [log] prometheus = %s: %s", at, c->prometheus, why3);
        return -1;
    }
    if (c->telemetry_interval_ms > 0 && c->telemetry_interval_ms < 10) {
        origin(ld, idx("log", "telemetry_interval_ms"), at, sizeof at);
        io_set_err(err, errlen, "%s: [log] telemetry_interval_ms = %d: must be 0 (off) or at "
                "least 10", at, c->telemetry_interval_ms);
        return -1;
    }
    char why2[512];
    if (llama_config_validate(&c->model, why2, sizeof why2) != 0) {
        io_set_err(err, errlen, "%s: bad model shape: %s", c->path, why2);
        return -1;
    }

    /* paths written in the job file are relative to its directory, so a job runs the
     * same from any working directory; a --set path is the shell's, relative to the
     * working directory */
    for (int i = 0; i < N_KEYS; i++) {
        if (!(keys[i].flags & KF_PATH) || !st[i].set || st[i].line == 0) continue;
        char *field = (char *)c + keys[i].offset;
        /* checkpoint.resume is a path or one of two words; data.tokenizer a path or bytes */
        if (i == idx("checkpoint", "resume") && (!strcmp(field, "auto") || !strcmp(field, "none")))
            continue;
        if (i == idx("data", "tokenizer") && !strcmp(field, "bytes")) continue;
        char joined[2100];
        int n = join_job_dir(c->path, field, joined, sizeof joined);
        if (n < 0 || (size_t)n >= keys[i].size) {
            origin(ld, i, at, sizeof at);
            io_set_err(err, errlen, "%s: [%s] %s: path longer than %zu characters once joined "
                    "to the job file's directory", at, keys[i].section, keys[i].key,
                    keys[i].size - 1);
            return -1;
        }
        memcpy(field, joined, (size_t)n + 1);
    }
    /* the tokenizer: the one of the model the run starts from, else bytes (after the
     * paths are joined: init_from is then where the model is) */
    c->tokenizer_given = st[idx("data", "tokenizer")].set;
    if (!c->tokenizer_given)
        snprintf(c->tokenizer, sizeof c->tokenizer, "%s",
                 c->init_from[0] && tokenizer_dir_has_one(c->init_from) ? c->init_from : "bytes");
    return 0;
}

int job_config_load(job_config *cfg, const char *path, int n_overrides,
                    char *const *overrides, char *err, size_t errlen) {
    return job_config_load_for(cfg, path, n_overrides, overrides, JOB_TRAIN, err, errlen);
}

int job_config_load_for(job_config *cfg, const char *path, int n_overrides,
                        char *const *overrides, job_use use, char *err, size_t errlen) {
    memset(cfg, 0, sizeof *cfg);
    cfg->use = use;
    if (strlen(path) >= sizeof cfg->path) {
        io_set_err(err, errlen, "%.200s...: path longer than %zu characters", path,
                sizeof cfg->path - 1);
        return -1;
    }
    strcpy(cfg->path, path);
    char *file_text;
    if (config_file_read(path, &file_text, err, errlen) != 0) return -1;

    /* the job's text: the file, then each --set on a line of its own */
    size_t len = strlen(file_text);
    for (int i = 0; i < n_overrides; i++) len += strlen(overrides[i]) + 7;
    cfg->text = malloc(len + 1);
    if (!cfg->text) {
        free(file_text);
        io_set_err(err, errlen, "%s: out of memory", path);
        return -1;
    }
    char *p = stpcpy(cfg->text, file_text);
    for (int i = 0; i < n_overrides; i++) p += sprintf(p, "\n--set %s", overrides[i]);

    loader ld = {.cfg = cfg};
    int rc = config_file_parse(file_text, path, on_entry, &ld, err, errlen);
    free(file_text);
    for (int i = 0; rc == 0 && i < n_overrides; i++)
        rc = apply_override(&ld, overrides[i], err, errlen);
    if (rc == 0) rc = resolve(&ld, err, errlen);
    for (int i = 0; i < N_KEYS; i++) free(ld.st[i].value);
    if (rc != 0) {
        job_config_free(cfg);
        return -1;
    }
    return 0;
}

void job_config_free(job_config *cfg) {
    free(cfg->text);
    cfg->text = NULL;
}

void job_config_print(const job_config *cfg, int world_size) {
    char name[64], value[1100];
    printf("# job %s (hash %016llx), world size %d\n", cfg->path,
           (unsigned long long)job_config_hash(cfg), world_size);
    for (int i = 0; i < N_KEYS; i++) {
        snprintf(name, sizeof name, "%s.%s", keys[i].section, keys[i].key);
        format_value(&keys[i], cfg, value, sizeof value);
        printf("  %-26s = %s\n", name, value);
        if (strcmp(keys[i].key, "n_heads") == 0 && strcmp(keys[i].section, "model") == 0)
            printf("  %-26s = %d (dim / n_heads)\n", "model.head_dim", cfg->model.head_dim);
    }
    int per_step = cfg->micro_batch * (world_size > 0 ? world_size : 1);
    printf("  %-26s = %lld\n", "params", (long long)llama_param_count(&cfg->model));
    printf("  %-26s = %lld\n", "tokens_per_step", (long long)cfg->global_batch * cfg->seq_len);
    if (cfg->global_batch % per_step == 0)
        printf("  %-26s = %d\n", "micro_steps_per_step", cfg->global_batch / per_step);
    fflush(stdout);
}

/* A key's default as shown by job_keys_print. */
static void default_text(const key_def *k, char *out, size_t outlen) {
    if (k->def) snprintf(out, outlen, "%s", k->def[0] ? k->def : "\"\"");
    else if (k->flags & KF_SHAPE) snprintf(out, outlen, "preset / init_from");
    else if (k->flags & KF_REQUIRED) snprintf(out, outlen, "required%s", k->flags & KF_TRAINING ? " (train)" : "");
    else snprintf(out, outlen, "derived");
}

void job_keys_print(FILE *out, int markdown) {
    char name[64], def[64];
    if (markdown) fprintf(out, "| key | default | meaning |\n|---|---|---|\n");
    for (int i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        snprintf(name, sizeof name, "%s.%s", k->section, k->key);
        default_text(k, def, sizeof def);
        if (markdown) fprintf(out, "| `%s` | `%s` | %s |\n", name, def, k->doc);
        else fprintf(out, "  %-34s %-19s %s\n", name, def, k->doc);
    }
}

/* The key named "section.key", or -1. */
static int find_named(const char *name) {
    const char *dot = strchr(name, '.');
    if (!dot) return -1;
    char section[32];
    snprintf(section, sizeof section, "%.*s", (int)(dot - name), name);
    return find_key(section, dot + 1);
}

const char *job_choice_name(const char *name, int v) {
    enum { MOST_CHOICES = 8 };
    /* a slot per key and word, each written with the same text whenever it is written */
    static char words[N_KEYS][MOST_CHOICES][24];
    int i = find_named(name);
    if (i < 0 || keys[i].type != KT_ENUM || v < 0 || v >= MOST_CHOICES) return "?";
    return choice_word(keys[i].choices, v, words[i][v], sizeof words[i][v]);
}

int job_key_check(const char *name, double v, char *why, size_t whylen) {
    int i = find_named(name);
    if (i < 0) {
        io_set_err(why, whylen, "internal error: no job key %s", name);
        return -1;
    }
    const key_def *k = &keys[i];
    char range[96];
    switch (k->type) {
    case KT_INT:
        if (v != floor(v)) break;
        if (!(v >= INT_MIN && v <= INT_MAX) || !in_range(k, v)) {
            range_text(k, range, sizeof range);
            io_set_err(why, whylen, "out of range, %s", range);
            return -1;
        }
        return 0;
    case KT_FLOAT:
        if (!isfinite(v)) {
            io_set_err(why, whylen, "not a number");
            return -1;
        }
        if (fabs(v) > FLT_MAX || !in_range(k, v)) {
            range_text(k, range, sizeof range);
            io_set_err(why, whylen, "out of range, %s", range);
            return -1;
        }
        return 0;
    case KT_BOOL:
        if (v == 0 || v == 1) return 0;
        io_set_err(why, whylen, "not a boolean (0 or 1)");
        return -1;
    case KT_U64:
        if (v >= 0 && v == floor(v)) return 0;
        io_set_err(why, whylen, "not an unsigned integer");
        return -1;
    case KT_STRING:
    case KT_ENUM:
        io_set_err(why, whylen, "internal error: %s is not a number", name);
        return -1;
    }
    io_set_err(why, whylen, "not an integer");
    return -1;
}

uint64_t job_config_hash(const job_config *cfg) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 offset basis */
    for (const unsigned char *p = (const unsigned char *)(cfg->text ? cfg->text : ""); *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull; /* FNV prime */
    }
    return h;
}
