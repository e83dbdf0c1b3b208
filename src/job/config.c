/* The job configuration (see config.h): one table of every key drives parsing, defaults,
 * range checks and printing; cross-key checks and derived defaults follow the table. */
#include "src/job/config.h"

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
#include "io/hash.h"
#include "io/hf_model.h"
#include "src/base/listen_addr.h"
#include "src/base/numbers.h"
#include "src/data/data_mix.h"
#include "src/families/families.h"
#include "src/job/lora_keys.h"
#include "src/tokenizer/tokenizer.h"

#define F(field) offsetof(job_config, field), sizeof(((job_config *)0)->field)
#define NOLIM 0, 0
#define IMAX ((double)INT_MAX)
#define FMAX ((double)FLT_MAX)

static const key_def keys[] = {
    /* [model]: a preset is applied first, then these override it */
    {"model", "preset", KT_STRING, F(preset), "", NOLIM, NULL, KF_PRESET,
     "a shape preset (any family's: `shardlm keys` lists them); the other [model] keys "
     "override it"},
    /* which family's [model] keys the job's others are: given, else the preset's, else
     * model.init_from's config.json's, else llama */
    {"model", "family", KT_STRING, F(family), "", NOLIM, NULL, KF_DERIVED,
     "the model family (the [model] keys below are its); default: the preset's, else "
     "model.init_from's config.json's, else llama"},
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
    /* the recipe of the blocks' linear layers (src/model/fp8_linear.h); master weights, reduced
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
    {"fsdp", "offload", KT_ENUM, F(offload), "none", NOLIM, "none|optimizer", 0,
     "optimizer: the fp32 master and the AdamW moments in host memory, AdamW on the host's "
     "cores; the device keeps the gradient and a fsdp.param_dtype copy of the weights"},
    {"fsdp", "activation_checkpointing", KT_ENUM, F(activation_checkpointing), "none", NOLIM,
     "none|full|selective", 0,
     "none, selective (recompute norms, attention, SwiGLU) or full (recompute each block)"},
    {"fsdp", "shard_group_size", KT_INT, F(shard_group_size), "0", 0, 1 << 24, NULL, 0,
     "shard over blocks of this many ranks, replicate across them; 0: the strategy's group"},
    {"fsdp", "trace", KT_BOOL, F(trace), "false", NOLIM, NULL, 0,
     "write each rank's schedule to <run_dir>/trace.rank<R>.jsonl"},

    /* [lora]: parameter-efficient fine-tuning (src/engine/model.h "LoRA"); rank 0 trains
     * every parameter. With init_from, adapter_config.json gives rank, alpha, targets,
     * rslora and dora (keys the job also gives must agree) and dropout unless the job
     * gives it */
    {"lora", "rank", KT_INT, F(lora.rank), "0", 0, 65536, NULL, 0,
     "LoRA's rank r: the base is frozen and low-rank adapters train; 0: every parameter "
     "trains"},
    {"lora", "alpha", KT_FLOAT, F(lora.alpha), NULL, 0, 1e6, NULL, KF_DERIVED | KF_MIN_OPEN,
     "the adapters' scale is alpha / rank (alpha / sqrt(rank) with rslora); default 2 x rank"},
    {"lora", "dropout", KT_FLOAT, F(lora.dropout), "0", 0, 1, NULL, KF_MAX_OPEN,
     "probability of dropping an adapter's input element in training (one mask per product "
     "input, drawn from train.seed and the sample)"},
    {"lora", "targets", KT_STRING, F(lora_targets), "q v", NOLIM, NULL, 0,
     "the adapted projections: any of q k v o gate up down, or attn, mlp, all"},
    {"lora", "rslora", KT_BOOL, F(lora.rslora), "false", NOLIM, NULL, 0,
     "rank-stabilised scale alpha / sqrt(rank)"},
    {"lora", "dora", KT_BOOL, F(lora.dora), "false", NOLIM, NULL, 0,
     "weight-decomposed LoRA: a trained magnitude per output row, the direction normalised"},
    {"lora", "init_from", KT_STRING, F(lora_init_from), "", NOLIM, NULL, KF_PATH,
     "a PEFT adapter directory (adapter_config.json, adapter_model.safetensors) the adapters "
     "start from, for train, eval and generate; empty: A random, B zero"},
    {"lora", "base_dtype", KT_ENUM, F(lora.base_nf4), "param_dtype", NOLIM, "param_dtype|nf4", 0,
     "how the frozen base is stored and gathered: in fsdp.param_dtype, or nf4 (QLoRA: the "
     "blocks' projection weights as 4-bit NormalFloat in blocks of 64, as bitsandbytes "
     "quantizes them at load; embeddings, norms and lm head stay in param_dtype)"},
    {"lora", "double_quant", KT_BOOL, F(lora.double_quant), "true", NOLIM, NULL, 0,
     "base_dtype = nf4: quantize the blocks' absmaxes again (8-bit, groups of 256), as QLoRA "
     "does"},

    {"data", "train", KT_STRING, F(data_train), NULL, NOLIM, NULL,
     KF_REQUIRED | KF_TRAINING | KF_PATH,
     "the training token file (shardlm data prepare), or a weighted mixture of several: "
     "PATH:WEIGHT, PATH:WEIGHT, ... (weights > 0, normalised); not needed by eval and "
     "generate"},
    {"data", "val", KT_STRING, F(data_val), "", NOLIM, NULL, KF_PATH,
     "the validation token file; empty: none"},
    {"data", "shuffle", KT_BOOL, F(shuffle), "true", NOLIM, NULL, 0,
     "permute the training windows every epoch (from train.seed)"},
    {"data", "doc_mask", KT_BOOL, F(doc_mask), "false", NOLIM, NULL, 0,
     "packed documents attend only within themselves and a document's first token is no "
     "target (the token file's document starts); false: plain packing"},
    /* a tokenizer file or model directory (src/tokenizer/tokenizer.h), or bytes; default: the
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
     * src/watch/device_table.c (n/a on the cpu backend and on a device the table lacks) */
    {"log", "peak_tflops", KT_FLOAT, F(peak_tflops), "0", 0, 1e6, NULL, 0,
     "the MFU denominator, dense TFLOP/s per device; 0: the device table's peak for the "
     "dtype in use (n/a on the cpu backend and on a device the table lacks)"},
    /* /metrics in Prometheus's text format from each node's local rank 0: PORT (on
     * 127.0.0.1), ADDR:PORT or [ADDR6]:PORT; empty: no server */
    {"log", "prometheus", KT_STRING, F(prometheus), "", NOLIM, NULL, 0,
     "serve /metrics (Prometheus text format) from each node's local rank 0 at PORT "
     "(127.0.0.1), ADDR:PORT or [ADDR6]:PORT; empty: no server"},
    /* the same metrics written to DIR/shardlm_<job>_<host>_<run id>.prom for node_exporter's
     * textfile collector (atomic rename, at most once a second; removed at the end) */
    {"log", "prometheus_textfile", KT_STRING, F(prometheus_textfile), "", NOLIM, NULL, KF_PATH,
     "write the same metrics to DIR/shardlm_<job>_<host>_<run id>.prom for node_exporter's "
     "textfile collector; empty: none"},
    /* TensorBoard event files from rank 0 (io/tfevents.h): the metrics.jsonl rows as
     * scalars and the resolved job as text; auto: <run_dir>/tb; empty: none */
    {"log", "tensorboard", KT_STRING, F(tensorboard), "", NOLIM, NULL, KF_PATH,
     "write TensorBoard event files to DIR from rank 0: metrics.jsonl's numbers as scalars, "
     "the resolved job as text; auto: <run_dir>/tb; empty: none"},
    /* GPU telemetry through NVML, sampled on a thread every N ms; 0: off */
    {"log", "telemetry_interval_ms", KT_INT, F(telemetry_interval_ms), "500", 0, 60000, NULL, 0,
     "NVML sampling period of the GPU telemetry, ms (0: off; else at least 10)"},

    /* [checkpoint]: <dir>/step_<N>.h5, <dir>/latest (docs/checkpoints.md "Checkpoints") */
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
    /* the training file is recognised by its size and a fingerprint of its first and last
     * MiB (io/tokens.h): another file under the same name is refused too */
    {"checkpoint", "allow_data_change", KT_BOOL, F(allow_data_change), "false", NOLIM, NULL, 0,
     "a resume may train on another data.train file than the checkpoint's: the next step "
     "takes the checkpoint's next sample index in the new file"},
    {"checkpoint", "allow_mix_change", KT_BOOL, F(allow_mix_change), "false", NOLIM, NULL, 0,
     "a resume may change the files or weights of a data.train mixture: each file the "
     "checkpoint knows continues from its position there, a new one from its start, and the "
     "new weights apply from the next step as from a fresh start"},
    /* how a save writes (io/ckpt_hdf5.h; benchmarks/RESULTS.md measures them); reads take
     * direct I/O wherever the file system allows it */
    {"checkpoint", "direct_io", KT_BOOL, F(ckpt_direct_io), "true", NOLIM, NULL, 0,
     "saves write each rank's bytes with O_DIRECT (falling back to MPI-IO where the file "
     "system refuses it); false: H5Dwrite through MPI-IO"},
    {"checkpoint", "async", KT_BOOL, F(ckpt_async), "true", NOLIM, NULL, 0,
     "checkpoint.every's saves copy the step's state to host memory and write it in the "
     "background while training goes on (one save at a time; the run's last save, a stop "
     "signal's, and every save where MPI or the host cannot, are synchronous); false: every "
     "save synchronous"},
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
    /* kernels/comm/comm_watchdog.h: both comm backends, the host reductions of a step, the
     * guarded regions of checkpoint saves and loads */
    {"runtime", "comm_timeout_s", KT_FLOAT, F(comm_timeout_s), "600", 0, 1e7, NULL, KF_MIN_OPEN,
     "a collective unfinished this many seconds after its issue ends the job, naming the "
     "ranks that did not arrive; in a checkpoint save or load, a phase this long sends a "
     "roll call and a rank that does not answer ends the job"},
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
    {"cuda", "graphs", KT_BOOL, F(cuda_graphs), "true", NOLIM, NULL, 0,
     "generation records a decode step once as a CUDA graph and replays it for each next "
     "token (a step is hundreds of short kernels); false: every op launched by itself"},

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
_Static_assert(MODEL_AC_NONE == 0 && MODEL_AC_FULL == 1 && MODEL_AC_SELECTIVE == 2,
               "fsdp.activation_checkpointing");
_Static_assert(SHLM_BACKEND_AUTO == 0 && SHLM_BACKEND_CPU == 1 && SHLM_BACKEND_CUDA == 2,
               "runtime.backend");
_Static_assert(SHLM_ATTENTION_SM90 == 0 && SHLM_ATTENTION_MMA_SYNC == 1, "cuda.attention");
_Static_assert(SHLM_NCCL_CTA_DEFAULT == 0 && SHLM_NCCL_CTA_EFFICIENCY == 1, "nccl.cta_policy");
_Static_assert(sizeof(fsdp_strategy) == sizeof(int) && sizeof(shlm_dtype) == sizeof(int) &&
                   sizeof(model_ac) == sizeof(int) && sizeof(nonfinite_policy) == sizeof(int) &&
                   sizeof(model_matmul) == sizeof(int) &&
                   sizeof(shlm_backend_choice) == sizeof(int) &&
                   sizeof(shlm_attention_kernels) == sizeof(int) &&
                   sizeof(shlm_nccl_cta_policy) == sizeof(int),
               "KT_ENUM fields are int-sized");

static const char *const sections[] = {"model", "train", "fsdp", "lora", "data", "log",
                                       "checkpoint", "runtime", "cuda", "nccl"};
#define N_SECTIONS ((int)(sizeof sections / sizeof sections[0]))

/* Where a key's value came from, for messages. */
typedef struct key_state {
    int set;      /* 0: default (or preset / derived) */
    int line;     /* > 0: line of the job file; 0 with set: a --set override */
    char *value;  /* the raw text, parsed again when the config is resolved */
} key_state;

/* A [model] entry that is not a job key: one of the family's, known once the family is
 * (model.family, the preset or init_from, resolved after every entry is read). */
typedef struct model_entry {
    char *key, *value;
    int line;           /* > 0: line of the job file; 0: a --set override */
    char at[1100];      /* where it was given, for messages */
} model_entry;

typedef struct loader {
    job_config *cfg;
    key_state st[N_KEYS];
    const char *set_arg; /* the --set argument being applied, NULL while in the file */
    model_entry *model;  /* [model] entries of the family, in the order given */
    int n_model;
    key_state *fst;      /* the family's keys (cfg->model.family->keys), once resolved */
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
    if (i < 0 && strcmp(section, "model") == 0) { /* the family's: checked once it is known */
        model_entry *g = realloc(ld->model, (size_t)(ld->n_model + 1) * sizeof *g);
        char *k = strdup(key), *v = strdup(value);
        if (!g || !k || !v) {
            free(k);
            free(v);
            if (g) ld->model = g;
            io_set_err(err, errlen, "%s: out of memory", at);
            return -1;
        }
        ld->model = g;
        g[ld->n_model] = (model_entry){.key = k, .value = v, .line = ld->set_arg ? 0 : line};
        snprintf(g[ld->n_model].at, sizeof g[ld->n_model].at, "%s", at);
        ld->n_model++;
        return 0;
    }
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
    if (key_parse(&keys[i], value, &scratch, why, sizeof why) != 0) {
        io_set_err(err, errlen, "%s: [%s] %s = '%s': %s", at, section, key, show(value, shown),
                why);
        return -1;
    }
    const char *text = (const char *)&scratch + keys[i].offset;
    if (keys[i].flags & KF_PRESET && text[0] && !family_of_preset(text, NULL)) {
        io_set_err(err, errlen, "%s: [%s] %s = '%s': unknown preset (known: %s)", at, section,
                   key, show(value, shown), family_preset_names());
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
    key_parse(&keys[i], ld->st[i].value, &scratch, why, sizeof why); /* checked when read */
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

/* ---- the model: its family, then the family's keys ---- */

/* The origin of family key i (ld->fst), for messages. */
static void forigin(const loader *ld, int i, char *out, size_t outlen) {
    const key_state *s = &ld->fst[i];
    const key_def *k = &ld->cfg->model.family->keys[i];
    if (s->set && s->line > 0) snprintf(out, outlen, "%s:%d", ld->cfg->path, s->line);
    else if (s->set) snprintf(out, outlen, "--set model.%s", k->key);
    else if (ld->cfg->preset[0]) snprintf(out, outlen, "preset %s", ld->cfg->preset);
    else snprintf(out, outlen, "%s", ld->cfg->path);
}

/* Which family the job's model is: model.family, else its preset's, else init_from's
 * config.json's (hf: that family, or NULL), else the first (llama); given ones must
 * agree. */
static int pick_family(loader *ld, const model_family *hf, const char *init_path, char *err,
                       size_t errlen) {
    job_config *c = ld->cfg;
    char at[1100];
    const model_family *named = NULL, *of_preset = NULL;
    const int i_family = idx("model", "family");
    if (c->family[0] && !(named = family_named(c->family))) {
        origin(ld, i_family, at, sizeof at);
        io_set_err(err, errlen, "%s: [model] family = %s: unknown (known: %s)", at, c->family,
                   family_names());
        return -1;
    }
    if (c->preset[0]) of_preset = family_of_preset(c->preset, NULL);
    if (named && of_preset && named != of_preset) {
        origin(ld, i_family, at, sizeof at);
        io_set_err(err, errlen, "%s: [model] family = %s, but preset %s is a %s model", at,
                   named->name, c->preset, of_preset->name);
        return -1;
    }
    const model_family *f = named ? named : of_preset ? of_preset : hf ? hf : model_families[0];
    if (hf && hf != f) {
        origin(ld, named ? i_family : idx("model", "preset"), at, sizeof at);
        io_set_err(err, errlen, "%s: [model] %s is a %s model, but %s/config.json "
                   "(model.init_from) is a %s model", at, named ? "family" : "preset",
                   f->name, init_path, hf->name);
        return -1;
    }
    c->model.family = f;
    snprintf(c->family, sizeof c->family, "%s", f->name);
    return 0;
}

/* The index of the family's key called name, or -1. */
static int family_key(const model_family *f, const char *name) {
    for (int i = 0; i < f->n_keys; i++)
        if (strcmp(f->keys[i].key, name) == 0) return i;
    return -1;
}

/* The [model] entries that are the family's keys, checked and recorded in ld->fst as job
 * keys are in ld->st (unknown ones named with the family's keys to choose from). */
static int take_model_entries(loader *ld, char *err, size_t errlen) {
    const model_family *f = ld->cfg->model.family;
    char shown[72], why[512];
    for (int e = 0; e < ld->n_model; e++) {
        const model_entry *m = &ld->model[e];
        const int i = family_key(f, m->key);
        if (i < 0) {
            int best = -1, best_d = 3;
            for (int k = 0; k < f->n_keys; k++) {
                int d = edit_distance(m->key, f->keys[k].key);
                if (d < best_d) best_d = d, best = k;
            }
            char hint[96] = "";
            if (best >= 0) snprintf(hint, sizeof hint, " (did you mean '%s'?)", f->keys[best].key);
            else suggest_key("model", m->key, hint, sizeof hint);
            io_set_err(err, errlen, "%s: unknown key '%s' in [model] (model.family = %s)%s",
                       m->at, show(m->key, shown), f->name, hint);
            return -1;
        }
        key_state *s = &ld->fst[i];
        if (s->set && (s->line > 0) == (m->line > 0)) {
            if (s->line > 0)
                io_set_err(err, errlen, "%s: duplicate key '%s' in [model] (first set on line %d)",
                           m->at, m->key, s->line);
            else
                io_set_err(err, errlen, "%s: given twice", m->at);
            return -1;
        }
        model_shape scratch = ld->cfg->model;
        if (key_parse(&f->keys[i], m->value, model_shape_data(&scratch), why, sizeof why) != 0) {
            io_set_err(err, errlen, "%s: [model] %s = '%s': %s", m->at, m->key,
                       show(m->value, shown), why);
            return -1;
        }
        free(s->value);
        s->value = strdup(m->value);
        if (!s->value) {
            io_set_err(err, errlen, "%s: out of memory", m->at);
            return -1;
        }
        s->set = 1;
        s->line = m->line;
    }
    return 0;
}

/* Every [model] key the job gives (set, or through its preset) that init_from's config.json
 * holds must hold config.json's value: all those that differ, in one message naming both
 * values, where the job's comes from, and the file. */
static int check_against_hf(const loader *ld, int have_preset, const model_shape *hf,
                            const char *dir, char *err, size_t errlen) {
    const job_config *c = ld->cfg;
    const model_family *f = c->model.family;
    char list[1400] = "", mine[64], their[64], at[1100];
    int n = 0;
    for (int i = 0; i < f->n_keys; i++) {
        if (!f->hf_names[i] || (!ld->fst[i].set && !have_preset)) continue;
        if (key_equal(&f->keys[i], model_shape_cdata(&c->model), model_shape_cdata(hf))) continue;
        key_format(&f->keys[i], model_shape_cdata(&c->model), mine, sizeof mine);
        key_format(&f->keys[i], model_shape_cdata(hf), their, sizeof their);
        forigin(ld, i, at, sizeof at);
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s = %s (%s) but %s = %s", n++ ? "; " : "",
                 f->keys[i].key, mine, at, f->hf_names[i], their);
    }
    if (!n) return 0;
    io_set_err(err, errlen, "%s: [model] disagrees with %s/config.json (model.init_from): %s; "
            "leave [model] out to take the architecture from config.json", c->path, dir, list);
    return -1;
}

/* The model's shape: the preset's, else the family's defaults with every KF_SHAPE key
 * given; the job's keys over it; config.json's (hf) where the job starts from a Hugging
 * Face directory (keys config.json does not hold stay the job's); derived fields; the
 * family's rules, each message at the key the job set. */
static int resolve_shape(loader *ld, const model_shape *hf, const char *init_path, char *err,
                         size_t errlen) {
    job_config *c = ld->cfg;
    const model_family *f = c->model.family;
    const int have_preset = c->preset[0] != 0;
    char why[512], at[1100];
    if (have_preset) {
        const model_preset *pr;
        family_of_preset(c->preset, &pr);
        memcpy(model_shape_data(&c->model), pr->shape, f->shape_size);
    } else {
        family_shape_defaults(f, &c->model);
        if (!c->hf_model) {
            char missing[256] = "", all[256] = "";
            for (int i = 0; i < f->n_keys; i++) {
                if (!(f->keys[i].flags & KF_SHAPE)) continue;
                size_t n = strlen(all);
                snprintf(all + n, sizeof all - n, "%s%s", n ? ", " : "", f->keys[i].key);
                if (ld->fst[i].set) continue;
                n = strlen(missing);
                snprintf(missing + n, sizeof missing - n, "%s%s", n ? ", " : "", f->keys[i].key);
            }
            if (missing[0]) {
                io_set_err(err, errlen,
                           "%s: [model] needs a preset (%s), all of %s, or init_from a Hugging "
                           "Face directory; missing: %s", c->path, family_preset_names(), all,
                           missing);
                return -1;
            }
        }
    }
    for (int i = 0; i < f->n_keys; i++)
        if (ld->fst[i].set)
            key_parse(&f->keys[i], ld->fst[i].value, model_shape_data(&c->model), why, sizeof why);
    /* what the job or its preset states (a preset's derived values follow the job's keys) */
    unsigned char given[256] = {0};
    for (int i = 0; i < f->n_keys && i < 256; i++)
        given[i] = ld->fst[i].set || (have_preset && !(f->keys[i].flags & KF_DERIVED));
    if (c->hf_model) {
        if (check_against_hf(ld, have_preset, hf, init_path, err, errlen) != 0) return -1;
        model_shape mine = c->model;
        c->model = *hf;
        for (int i = 0; i < f->n_keys; i++) {
            if (f->hf_names[i]) {
                given[i] = 1;
                continue;
            }
            const key_def *k = &f->keys[i];
            memcpy((char *)model_shape_data(&c->model) + k->offset,
                   (const char *)model_shape_cdata(&mine) + k->offset, k->size);
        }
    }
    /* without a preset or a config.json, the context is train.seq_len unless given */
    const int i_msl = family_key(f, "max_seq_len");
    if (!have_preset && !c->hf_model && i_msl >= 0 && !ld->fst[i_msl].set) {
        if (!c->seq_len_given) { /* a forward-only job: one of the two says the context */
            io_set_err(err, errlen, "%s: [train] seq_len or [model] max_seq_len is required",
                    c->path);
            return -1;
        }
        f->set_max_seq_len(model_shape_data(&c->model), c->seq_len);
        given[i_msl] = 1;
    }
    f->derive(model_shape_data(&c->model), given);
    int blame[2];
    char msg[512];
    if (f->validate(model_shape_cdata(&c->model), msg, sizeof msg, blame) != 0) {
        if (blame[0] < 0) {
            io_set_err(err, errlen, "%s: bad model shape: %s", c->path, msg);
            return -1;
        }
        int b = blame[0];
        if (!ld->fst[b].set && blame[1] >= 0 && ld->fst[blame[1]].set) b = blame[1];
        forigin(ld, b, at, sizeof at);
        io_set_err(err, errlen, "%s: %s", at, msg);
        return -1;
    }
    if (!c->seq_len_given) c->seq_len = model_shape_max_seq_len(&c->model);
    if (c->seq_len > model_shape_max_seq_len(&c->model)) {
        if (ld->st[idx("train", "seq_len")].set || i_msl < 0) origin(ld, idx("train", "seq_len"), at, sizeof at);
        else forigin(ld, i_msl, at, sizeof at);
        io_set_err(err, errlen, "%s: [train] seq_len = %d is larger than [model] max_seq_len = %d",
                at, c->seq_len, model_shape_max_seq_len(&c->model));
        return -1;
    }
    return 0;
}

static int resolve_model(loader *ld, char *err, size_t errlen) {
    job_config *c = ld->cfg;
    const key_state *st = ld->st;
    char at[1100], why[1536];
    /* model.init_from: a Hugging Face directory gives the architecture */
    const int i_init = idx("model", "init_from");
    char init_path[1024] = "";
    model_shape hf = {0};
    if (st[i_init].set && init_from_path(ld, init_path, sizeof init_path, err, errlen) != 0)
        return -1;
    if (init_path[0]) {
        int kind = hf_source_kind(init_path, why, sizeof why);
        if (kind < 0 || (kind == HF_SOURCE_HF_DIR &&
                         family_shape_from_hf(init_path, &hf, why, sizeof why) != 0)) {
            origin(ld, i_init, at, sizeof at);
            io_set_err(err, errlen, "%s: [model] init_from: %s", at, why);
            return -1;
        }
        c->hf_model = kind == HF_SOURCE_HF_DIR;
    }
    if (pick_family(ld, c->hf_model ? hf.family : NULL, init_path, err, errlen) != 0) return -1;
    ld->fst = calloc((size_t)c->model.family->n_keys, sizeof *ld->fst);
    if (!ld->fst) {
        io_set_err(err, errlen, "%s: out of memory", c->path);
        return -1;
    }
    if (take_model_entries(ld, err, errlen) != 0) return -1;
    return resolve_shape(ld, &hf, init_path, err, errlen);
}

/* [lora] (after the paths are joined: lora.init_from is then where the adapter is): the
 * targets' words; an adapter directory's adapter_config.json over the defaults, the keys the
 * job also gives agreeing with it; alpha's default; the rules. */
static int resolve_lora(loader *ld, char *err, size_t errlen) {
    job_config *c = ld->cfg;
    const key_state *st = ld->st;
    char at[1100], bad[72], why[1536], shown[72];
    const int i_rank = idx("lora", "rank"), i_alpha = idx("lora", "alpha");
    const int i_drop = idx("lora", "dropout"), i_tg = idx("lora", "targets");
    const int i_rs = idx("lora", "rslora"), i_dora = idx("lora", "dora");
    const int i_init = idx("lora", "init_from");
    const int i_bd = idx("lora", "base_dtype"), i_dq = idx("lora", "double_quant");
    lora_config *L = &c->lora;
    if (lora_targets_parse(c->lora_targets, &L->targets, bad, sizeof bad) != 0) {
        origin(ld, i_tg, at, sizeof at);
        io_set_err(err, errlen, "%s: [lora] targets = '%s': %s%s%s (known: q k v o gate up down, "
                   "attn, mlp, all)", at, show(c->lora_targets, shown),
                   bad[0] ? "unknown target '" : "no target", bad, bad[0] ? "'" : "");
        return -1;
    }
    if (c->lora_init_from[0]) {
        origin(ld, i_init, at, sizeof at);
        peft_config pc;
        model_desc d;
        unsigned mask = 0;
        if (peft_config_read(c->lora_init_from, &pc, why, sizeof why) != 0) {
            io_set_err(err, errlen, "%s: [lora] init_from: %s", at, why);
            return -1;
        }
        model_shape_desc_open(&d, &c->model);
        const int ok = lora_targets_of_peft(&d.lay, &pc, &mask, why, sizeof why) == 0;
        model_desc_close(&d);
        if (!ok) {
            io_set_err(err, errlen, "%s: [lora] init_from: %s/%s: %s", at, c->lora_init_from,
                       PEFT_CONFIG_FILE, why);
            return -1;
        }
        /* what the job also says must be the adapter's */
        const struct {
            int key, differs;
            const char *peft_name;
        } agree[] = {{i_rank, L->rank != pc.r, "r"},
                     {i_alpha, L->alpha != (float)pc.lora_alpha, "lora_alpha"},
                     {i_tg, L->targets != mask, "target_modules"},
                     {i_rs, L->rslora != pc.use_rslora, "use_rslora"},
                     {i_dora, L->dora != pc.use_dora, "use_dora"}};
        for (size_t i = 0; i < sizeof agree / sizeof agree[0]; i++) {
            if (!st[agree[i].key].set || !agree[i].differs) continue;
            char mine[200], where[1100];
            key_format(&keys[agree[i].key], c, mine, sizeof mine);
            origin(ld, agree[i].key, where, sizeof where);
            io_set_err(err, errlen, "%s: [lora] %s = %s but %s/%s (lora.init_from) has %s = "
                       "%s; leave [lora] %s out to take the adapter's", where, keys[agree[i].key].key,
                       mine, c->lora_init_from, PEFT_CONFIG_FILE, agree[i].peft_name,
                       agree[i].key == i_rank ? (snprintf(why, sizeof why, "%d", pc.r), why)
                       : agree[i].key == i_alpha ? (snprintf(why, sizeof why, "%g", pc.lora_alpha), why)
                       : agree[i].key == i_tg ? (lora_targets_text(mask, why, sizeof why), why)
                       : (agree[i].key == i_rs ? pc.use_rslora : pc.use_dora) ? "true" : "false",
                       keys[agree[i].key].key);
            return -1;
        }
        *L = (lora_config){.rank = pc.r, .alpha = (float)pc.lora_alpha,
                           .dropout = st[i_drop].set ? L->dropout : (float)pc.lora_dropout,
                           .targets = mask, .rslora = pc.use_rslora, .dora = pc.use_dora,
                           .base_nf4 = L->base_nf4, .double_quant = L->double_quant};
        lora_targets_text(mask, c->lora_targets, sizeof c->lora_targets);
    } else if (L->rank == 0) {
        const int given[] = {i_alpha, i_drop, i_tg, i_rs, i_dora, i_bd, i_dq};
        for (size_t i = 0; i < sizeof given / sizeof given[0]; i++) {
            if (!st[given[i]].set) continue;
            origin(ld, given[i], at, sizeof at);
            char v[200];
            key_format(&keys[given[i]], c, v, sizeof v);
            io_set_err(err, errlen, "%s: [lora] %s = %s needs [lora] rank > 0 (rank 0 is full "
                       "fine-tuning, without adapters)", at, keys[given[i]].key, v);
            return -1;
        }
        *L = (lora_config){0};
        return 0;
    } else if (!st[i_alpha].set) {
        L->alpha = 2.0f * (float)L->rank;
    }
    if (st[i_dq].set && !L->base_nf4) {
        origin(ld, i_dq, at, sizeof at);
        io_set_err(err, errlen, "%s: [lora] double_quant = %s needs [lora] base_dtype = nf4 (it "
                   "quantizes NF4's scales)", at, L->double_quant ? "true" : "false");
        return -1;
    }
    if (!L->base_nf4) L->double_quant = 0;
    if (L->dora && L->dropout > 0 && c->use == JOB_TRAIN) {
        origin2(ld, i_drop, i_dora, at, sizeof at);
        io_set_err(err, errlen, "%s: [lora] dora with dropout = %g: training DoRA with dropout "
                   "(PEFT computes the base product a second time on the dropped input) is not "
                   "supported; set [lora] dropout = 0", at, L->dropout);
        return -1;
    }
    if (c->init_from[0] && !c->hf_model) {
        origin(ld, idx("model", "init_from"), at, sizeof at);
        io_set_err(err, errlen, "%s: [lora] rank %d needs [model] init_from to be a Hugging Face "
                   "directory (the frozen base a PEFT adapter names) or empty, not a shardlm "
                   "checkpoint: export it first (shardlm ckpt export)", at, L->rank);
        return -1;
    }
    return 0;
}

static int resolve(loader *ld, char *err, size_t errlen) {
    job_config *c = ld->cfg;
    const key_state *st = ld->st;
    char at[1100];

    /* defaults: the table's text, through the same parser as a job file's values */
    char why[512];
    for (int i = 0; i < N_KEYS; i++) {
        if (keys[i].def && !(keys[i].flags & KF_MODEL) &&
            key_parse(&keys[i], keys[i].def, c, why, sizeof why) != 0) {
            io_set_err(err, errlen, "internal error: default of %s.%s: %s", keys[i].section,
                    keys[i].key, why);
            return -1;
        }
    }

    /* what the job says, over the defaults (already validated when read) */
    for (int i = 0; i < N_KEYS; i++)
        if (st[i].set) key_parse(&keys[i], st[i].value, c, why, sizeof why);
    c->seq_len_given = st[idx("train", "seq_len")].set;

    /* the model: its family, then its shape (resolve_model) */
    if (resolve_model(ld, err, errlen) != 0) return -1;

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
    const int i_gb = idx("train", "global_batch"), i_min_lr = idx("train", "min_lr");
    const int i_run_dir = idx("log", "run_dir");
    if (!st[i_min_lr].set) c->min_lr = c->lr / 10;
    if (!st[i_run_dir].set) {
        const char *base = strrchr(c->path, '/');
        base = base ? base + 1 : c->path;
        size_t n = strlen(base);
        if (n > 4 && strcmp(base + n - 4, ".ini") == 0) n -= 4;
        snprintf(c->run_dir, sizeof c->run_dir, "runs/%.*s", (int)n, base);
    }

    /* cross-key checks */
    const int i_mb = idx("train", "micro_batch");
    const int i_lr = idx("train", "lr"), i_warm = idx("train", "warmup_steps");
    const int i_steps = idx("train", "steps");
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
    if (c->prometheus[0] && listen_addr_parse(c->prometheus, host, sizeof host, port,
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
    /* paths written in the job file are relative to its directory, so a job runs the
     * same from any working directory; a --set path is the shell's, relative to the
     * working directory. data.train is one file or a weighted list of them
     * (src/data/data_mix.h): each of its paths is joined */
    const int i_train = idx("data", "train");
    if (st[i_train].set && c->data_train[0]) {
        static data_mix_list l; /* 17 KB: not on the stack */
        char why4[700];
        origin(ld, i_train, at, sizeof at);
        if (data_mix_parse(c->data_train, &l, why4, sizeof why4) != 0) {
            io_set_err(err, errlen, "%s: [data] train: %s", at, why4);
            return -1;
        }
        for (int k = 0; k < l.n && st[i_train].line > 0; k++) {
            char joined[2100];
            int n = join_job_dir(c->path, l.e[k].path, joined, sizeof joined);
            if (n < 0 || (size_t)n >= sizeof l.e[k].path) {
                io_set_err(err, errlen, "%s: [data] train: path longer than %zu characters once "
                        "joined to the job file's directory", at, sizeof l.e[k].path - 1);
                return -1;
            }
            memcpy(l.e[k].path, joined, (size_t)n + 1);
        }
        if (data_mix_format(&l, c->data_train, sizeof c->data_train) < 0) {
            io_set_err(err, errlen, "%s: [data] train: the list is longer than %zu characters "
                    "once its paths are joined to the job file's directory, or a joined path "
                    "holds ',' (which separates the files)", at, sizeof c->data_train - 1);
            return -1;
        }
    }
    for (int i = 0; i < N_KEYS; i++) {
        if (!(keys[i].flags & KF_PATH) || !st[i].set || st[i].line == 0 || i == i_train) continue;
        char *field = (char *)c + keys[i].offset;
        /* checkpoint.resume is a path or one of two words; data.tokenizer a path or bytes;
         * log.tensorboard a path or auto */
        if (i == idx("checkpoint", "resume") && (!strcmp(field, "auto") || !strcmp(field, "none")))
            continue;
        if (i == idx("data", "tokenizer") && !strcmp(field, "bytes")) continue;
        if (i == idx("log", "tensorboard") && !strcmp(field, "auto")) continue;
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
    if (resolve_lora(ld, err, errlen) != 0) return -1;
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
    for (int i = 0; ld.fst && i < cfg->model.family->n_keys; i++) free(ld.fst[i].value);
    free(ld.fst);
    for (int e = 0; e < ld.n_model; e++) {
        free(ld.model[e].key);
        free(ld.model[e].value);
    }
    free(ld.model);
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

void job_config_fprint(FILE *out, const job_config *cfg, int world_size) {
    char name[64], value[1100];
    fprintf(out, "# job %s (hash %016llx), world size %d\n", cfg->path,
            (unsigned long long)job_config_hash(cfg), world_size);
    const model_family *f = cfg->model.family;
    for (int i = 0; i < N_KEYS; i++) {
        snprintf(name, sizeof name, "%s.%s", keys[i].section, keys[i].key);
        key_format(&keys[i], cfg, value, sizeof value);
        fprintf(out, "  %-26s = %s\n", name, value);
        /* the family's keys after the job's [model] ones */
        if (i + 1 < N_KEYS && strcmp(keys[i].section, "model") == 0 &&
            strcmp(keys[i + 1].section, "model") != 0)
            for (int k = 0; k < f->n_keys; k++) {
                snprintf(name, sizeof name, "model.%s", f->keys[k].key);
                key_format(&f->keys[k], model_shape_cdata(&cfg->model), value, sizeof value);
                fprintf(out, "  %-26s = %s\n", name, value);
            }
    }
    int per_step = cfg->micro_batch * (world_size > 0 ? world_size : 1);
    fprintf(out, "  %-26s = %lld\n", "params", (long long)model_shape_param_count(&cfg->model));
    fprintf(out, "  %-26s = %lld\n", "tokens_per_step", (long long)cfg->global_batch * cfg->seq_len);
    if (cfg->global_batch % per_step == 0)
        fprintf(out, "  %-26s = %d\n", "micro_steps_per_step", cfg->global_batch / per_step);
    fflush(out);
}

void job_config_print(const job_config *cfg, int world_size) {
    job_config_fprint(stdout, cfg, world_size);
}

/* A key's default as shown by job_keys_print. */
static void default_text(const key_def *k, char *out, size_t outlen) {
    if (k->def) snprintf(out, outlen, "%s", k->def[0] ? k->def : "\"\"");
    else if (k->flags & KF_SHAPE) snprintf(out, outlen, "preset / init_from");
    else if (k->flags & KF_REQUIRED) snprintf(out, outlen, "required%s", k->flags & KF_TRAINING ? " (train)" : "");
    else snprintf(out, outlen, "derived");
}

/* One line of `shardlm keys`: name, default, meaning (families: which have it, where the
 * key is not every family's alike). */
static void print_key(FILE *out, int markdown, const key_def *k, const char *families) {
    char name[64], def[64], doc[600];
    snprintf(name, sizeof name, "%s.%s", k->section, k->key);
    default_text(k, def, sizeof def);
    if (families[0]) snprintf(doc, sizeof doc, "(%s) %s", families, k->doc);
    else snprintf(doc, sizeof doc, "%s", k->doc);
    if (markdown) fprintf(out, "| `%s` | `%s` | %s |\n", name, def, doc);
    else fprintf(out, "  %-34s %-19s %s\n", name, def, doc);
}

/* Whether two key rows print the same (name, default and meaning). */
static int same_row(const key_def *a, const key_def *b) {
    return strcmp(a->key, b->key) == 0 && strcmp(a->doc, b->doc) == 0 &&
           (a->def == b->def || (a->def && b->def && strcmp(a->def, b->def) == 0)) &&
           (a->flags & (KF_SHAPE | KF_REQUIRED)) == (b->flags & (KF_SHAPE | KF_REQUIRED));
}

void job_keys_print(FILE *out, int markdown) {
    if (markdown) fprintf(out, "| key | default | meaning |\n|---|---|---|\n");
    int n_families = 0;
    while (model_families[n_families]) n_families++;
    for (int i = 0; i < N_KEYS; i++) {
        print_key(out, markdown, &keys[i], "");
        if (!(i + 1 < N_KEYS && strcmp(keys[i].section, "model") == 0 &&
              strcmp(keys[i + 1].section, "model") != 0))
            continue;
        /* the families' [model] keys: each row once, with the families it belongs to when
         * not all of them */
        for (int a = 0; a < n_families; a++) {
            const model_family *fa = model_families[a];
            for (int k = 0; k < fa->n_keys; k++) {
                int printed = 0;
                for (int b = 0; b < a && !printed; b++)
                    for (int j = 0; j < model_families[b]->n_keys; j++)
                        if (same_row(&model_families[b]->keys[j], &fa->keys[k])) printed = 1;
                if (printed) continue;
                char families[256] = "";
                int count = 0;
                for (int b = a; b < n_families; b++)
                    for (int j = 0; j < model_families[b]->n_keys; j++)
                        if (same_row(&model_families[b]->keys[j], &fa->keys[k])) {
                            snprintf(families + strlen(families), sizeof families - strlen(families),
                                     "%s%s", count++ ? ", " : "", model_families[b]->name);
                            break;
                        }
                print_key(out, markdown, &fa->keys[k], count == n_families ? "" : families);
            }
        }
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

int job_key_option(const char *name, const char *opt, const char *v, double *out, char *err,
                   size_t errlen) {
    const int i = find_named(name);
    if (i < 0 || (keys[i].type != KT_INT && keys[i].type != KT_FLOAT)) {
        io_set_err(err, errlen, "internal error: %s is not a number key", name);
        return -1;
    }
    const key_def *k = &keys[i];
    if (k->type == KT_INT) {
        long long x;
        const long long lo = (long long)k->min + !!(k->flags & KF_MIN_OPEN);
        const long long hi = (long long)k->max - !!(k->flags & KF_MAX_OPEN);
        if (num_option_int(opt, v, lo, hi, &x, err, errlen) != 0) return -1;
        *out = (double)x;
        return 0;
    }
    const int open = (k->flags & KF_MIN_OPEN ? NUM_LO_OPEN : 0) |
                     (k->flags & KF_MAX_OPEN ? NUM_HI_OPEN : 0);
    return num_option_double(opt, v, k->min, k->max >= FMAX ? HUGE_VAL : k->max, open, out, err,
                             errlen);
}

const char *job_choice_name(const char *name, int v) {
    enum { MOST_CHOICES = 8 };
    /* a slot per key and word, each written with the same text whenever it is written */
    static char words[N_KEYS][MOST_CHOICES][24];
    int i = find_named(name);
    if (i < 0 || keys[i].type != KT_ENUM || v < 0 || v >= MOST_CHOICES) return "?";
    return key_choice_word(keys[i].choices, v, words[i][v], sizeof words[i][v]);
}

int job_key_check(const char *name, double v, char *why, size_t whylen) {
    int i = find_named(name);
    if (i < 0) {
        io_set_err(why, whylen, "internal error: no job key %s", name);
        return -1;
    }
    return key_check_number(&keys[i], v, why, whylen);
}

model_opts job_model_opts(const job_config *c, model_ac ac) {
    return (model_opts){.ac = ac, .matmul = c->matmul, .fp8_fast_accum = c->fp8_fast_accum,
                        .lora = c->lora, .eager_decode = !c->cuda_graphs};
}

uint64_t job_config_hash(const job_config *cfg) {
    const char *text = cfg->text ? cfg->text : "";
    return shlm_fnv1a64(SHLM_FNV1A64_BASIS, text, strlen(text));
}
