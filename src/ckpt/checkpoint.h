/* Checkpoints of a training run: which rank writes and reads which slice of which
 * Hugging Face tensor, the commit protocol (temporary name, rename, `latest`), resume. */
#ifndef SHLM_CHECKPOINT_H
#define SHLM_CHECKPOINT_H

/*
 * A checkpoint is <dir>/step_<N>.h5 (io/ckpt_hdf5.h has the layout). Saving:
 *   1. all ranks create <dir>/step_<N>.h5.tmp.<16 random hex digits> (rank 0 picks the
 *      name) with parallel HDF5, exclusively (nothing already there is truncated or
 *      followed, io/ckpt_hdf5.h), and write, per dataset,
 *      the part of the tensor their shard covers (padding is not stored), as a flat
 *      element range of the dataset (io/ckpt_hdf5.h: O_DIRECT to the dataset's bytes, or
 *      H5Dwrite of the range's hyperslabs through MPI-IO). Replicas
 *      (HYBRID_SHARD, NO_SHARD, shard_group_size < world) split their common shard
 *      into replica_size pieces, one each, so no byte is written twice;
 *   2. the checksums (partial sums over what each rank wrote, one MPI_Allreduce) and
 *      the training state go in as attributes; every rank closes the file;
 *   3. rank 0 fsyncs the file, renames it to step_<N>.h5, fsyncs the directory, then
 *      writes `latest` (one line: the file name, "step_<N>.h5") under a temporary name
 *      and renames it onto <dir>/latest; a symbolic link at either name is refused
 *      (io/safe_file.h);
 *   4. rank 0 removes leftover temporary files of failed (killed) saves (regular files
 *      only) and, with keep = K > 0, the oldest step_*.h5 beyond the newest K.
 * Before anything is written, the file's size (an upper bound) is checked against the
 * free space and the file-size limit (ulimit -f); SHLM_TEST_NO_SPACE_CHECK=1, a test hook, skips that.
 * Metadata is written and flushed before the data, so a disk that fills up during the
 * data still leaves a file HDF5 can close (io/ckpt_hdf5.h, ckpt_h5_flush).
 * A failure anywhere (one rank or all) fails the save on every rank with one message,
 * removes the temporary file, and leaves `latest` and earlier checkpoints as they were.
 *
 * Loading reads, per dataset, the part the rank's (new) shard needs, so any world size
 * and strategy loads a checkpoint of any other; every element is also summed by exactly
 * one rank and the checksums compared, naming the first dataset that differs.
 *
 * Deadlines: every collective function here is a guarded region of the comm watchdog
 * (kernels/comm/comm_watchdog.h), each phase of a save or load (creating the file, writing
 * the metadata, the data, closing, committing...) named in it. A rank that stops answering
 * (stopped, dead, its process hung) ends the job within runtime.comm_timeout_s or two,
 * named, wherever in HDF5 the others wait; `latest` still names the previous checkpoint.
 * While every rank answers, a save or load may take runtime.comm_timeout_s + its size at
 * 10 MB/s (at least 60 s) before the job ends: a slow disk is not a hang.
 *
 * Test hooks: SHLM_TEST_KILL_IN_SAVE=RANK[:STEP] makes world rank RANK raise SIGKILL
 * after writing half of the datasets of the save of step STEP (of any save without
 * :STEP), to test that a crash mid-save leaves the previous checkpoint in charge;
 * SHLM_TEST_STOP_IN_SAVE=RANK[:STEP] makes it raise SIGSTOP once the save's file exists,
 * before its metadata, SHLM_TEST_SLOW_SAVE=RANK[:STEP] makes it sleep twice
 * runtime.comm_timeout_s after writing its data (a slow disk, which must not end the job),
 * and SHLM_TEST_STOP_IN_LOAD=RANK raise SIGSTOP once a load has opened its file, before
 * the data: to test the deadlines. SHLM_TEST_WRITE_ERROR=RANK[:STEP] makes the rank's write
 * fail after half of the datasets (an I/O error naming the file), to test how a failed
 * save, in the background too, ends the run.
 *
 * All functions are collective over the world and return the same status on every
 * rank; on failure err holds the same one-line message on every rank.
 */

#include <stddef.h>
#include <stdint.h>

#include "src/data/data_mix.h"
#include "src/job/config.h"
#include "src/engine/fsdp.h"
#include "src/ckpt/hf_files.h"
#include "src/engine/topology.h"

/* Training state kept beside the tensors. */
typedef struct ckpt_state {
    int64_t step;             /* training steps done: the schedule's and the data's clock */
    int64_t adamw_step;       /* updates applied (AdamW's step count): step minus the
                               * steps skipped under train.on_nonfinite = skip */
    int64_t skipped_in_a_row; /* non-finite steps skipped since the last applied update */
    int64_t tokens_seen;
    uint64_t data_position;   /* next global sample index of the data loader */
    uint64_t seed;            /* train.seed: init, data order (with shuffle), sampling */
    int shuffle;
    int global_batch, seq_len;
    int steps;                /* train.steps the schedule spans */
    double lr_last;           /* learning rate of the last step taken */
    int64_t lr_decay_from;    /* -1: the job's schedule; else the cosine starts at this
                               * 0-based step with lr_decay_lr (src/engine/optim.h: a schedule
                               * extended when a resume changed train.steps) */
    double lr_decay_lr;
    /* the training token file it was saved from (data.train): the path as the job gave
     * it, its size and fingerprint (io/tokens.h); "" and 0 in files of format 3 and older */
    char data_train[1024];
    uint64_t data_bytes, data_fingerprint;
    /* a mixture of several files (src/data/data_mix.h, data_mix_state_text): each source's
     * windows taken, taken since the weights took effect, size, fingerprint, weight and
     * path, a line each; "" for one file and in files of format 4 and older (then
     * data_bytes and data_fingerprint are 0) */
    char data_sources[DATA_MIX_MAX * (DATA_MIX_PATH + 128)];
    /* LoRA (format 5; 0 and "" in older files and in full training): the adapters' layout
     * (lora.rank, the lora.targets mask, lora.dora), what the datasets are, and the frozen
     * base's identity: model.init_from as the job gave it ("": train.seed's
     * initialisation) and its fingerprint (fsdp_base_fingerprint) */
    int lora_rank, lora_targets, lora_dora;
    char lora_base[1024];
    uint64_t lora_base_fingerprint;
    /* LoRA's scale and dropout (format 6; 0 in older files and in full training):
     * lora.alpha, lora.rslora, lora.dropout, what a PEFT export's adapter_config.json says */
    float lora_alpha, lora_dropout;
    int lora_rslora;
    /* read back only: */
    char strategy[16];
    int world_size, shard_size, replica_size;
    int format_version;       /* 1: no state checksum (range checks only) */
} ckpt_state;

/* What a load takes from the file. */
typedef enum ckpt_load_what {
    CKPT_LOAD_WEIGHTS = 0, /* /model only: moments stay as they are (zero when fresh) */
    CKPT_LOAD_ALL = 1      /* /model and /optim: resuming a run */
} ckpt_load_what;

/* Saves the engine's state and *st as <dir>/step_<st->step>.h5 (protocol above), with the
 * Hugging Face files hf (the same on every rank; NULL or none: no /hf group) as byte
 * datasets /hf/<name> that the state checksum covers; keep as checkpoint.keep. Rank 0
 * prints one line with the size, time and GB/s. */
int checkpoint_save(fsdp_engine *e, const topology *topo, const job_config *cfg,
                    const ckpt_state *st, const hf_files *hf, const char *dir, int keep,
                    char *err, size_t errlen);

/*
 * Saving in the background (checkpoint.async = true). At the step it saves, each rank
 * copies its shards of the weights and both moments into host staging buffers (allocated
 * once, at the start, page-locked on a device; the copy is the engine's device-to-host
 * transfer on a side stream, a memcpy on the cpu backend) and returns to training; a writer thread per rank then runs the save
 * protocol above, unchanged (so the file is the synchronous save's, byte for byte, but
 * for created_utc and the job's text), over a duplicate of the world that only the writer
 * threads use: parallel HDF5's MPI-IO collectives from a second thread need
 * MPI_THREAD_MULTIPLE (without it the run saves synchronously, saying so), and HDF5
 * itself is called by no other thread while a save is in flight (the training makes no
 * HDF5 call). One save at a time: the next waits for the one in flight, rank 0 saying how
 * long. The writer's outcome is agreed by its ranks (the protocol's last step), and each
 * step boundary asks all ranks whether their writer has finished, so every rank learns of
 * a failure at the same step and the run stops there, as after a failed synchronous save.
 * SIGKILL mid-save leaves `latest` where it was (the commit is the protocol's last step).
 */
typedef struct ckpt_async ckpt_async;

/* Whether a run of cfg that trains steps first+1..end saves in the background: with
 * checkpoint.async, a checkpoint.dir and a save of checkpoint.every before step `end`
 * (the last save and a stop signal's are synchronous, so a run without such a save would
 * stage nothing). The one rule of train (src/run/loop.c) and `shardlm plan`. */
int checkpoint_async_used(const job_config *cfg, int first, int end);
/* The host staging bytes of this rank: its shards of the FSDP_STATE_N state kinds. */
uint64_t checkpoint_async_staging_bytes(fsdp_engine *e);
/* Starts saving in the background: the staging allocated (ops->host_alloc's page-locked
 * memory where the backend has it), a duplicate of the world made.
 * host_avail (bytes this rank may allocate, avail_what saying what they are; < 0:
 * unknown) bounds the staging. When MPI gives no MPI_THREAD_MULTIPLE or the host cannot
 * hold the staging, rank 0 prints why the run saves synchronously and -1 is returned on
 * every rank (*out NULL). Collective. */
int checkpoint_async_open(ckpt_async **out, const shlm_ops *ops, fsdp_engine *e,
                          const topology *topo, const job_config *cfg, const hf_files *hf,
                          double host_avail, const char *avail_what);
/* Saves *st in the background (checkpoint.dir, checkpoint.keep): waits for the save in
 * flight, returning -1 with its message if it failed (every rank the same), then copies
 * the state and starts the writer. Local (the ranks agree through the writers). */
int checkpoint_async_save(ckpt_async *a, const ckpt_state *st, char *err, size_t errlen);
/* At a step boundary: when every rank's writer has finished, joins them and returns the
 * save's outcome (-1 with its message when it failed); else 0, the save still in flight.
 * Collective while a save is in flight; a no-op otherwise and for a NULL a. */
int checkpoint_async_poll(ckpt_async *a, char *err, size_t errlen);
/* Waits for the save in flight (none, or a NULL a: 0) and returns its outcome. */
int checkpoint_async_wait(ckpt_async *a, char *err, size_t errlen);
/* Whether a save is in flight. */
int checkpoint_async_in_flight(const ckpt_async *a);
/* Waits for the save in flight (outcome ignored: for runs already ending on an error)
 * and frees everything. Collective (the duplicate of the world is freed); NULL is fine. */
void checkpoint_async_close(ckpt_async *a);

/* checkpoint.dir of a training run, before step 1 (a no-op when cfg->ckpt_dir is ""):
 * refuses a directory name too long for its files; rank 0 creates the directory
 * (mkdir -p), takes its lock <dir>/shardlm.lock (flock, with "host H pid P job HASH
 * (JOB.ini)" written in it; a second run refuses, naming that holder; the lock ends with
 * the process, so a dead holder's lock is free again; a file system without flock only
 * gets a warning), refuses symbolic links at `latest` and step_<N>.h5, and creates,
 * writes and removes a file there (EROFS, EACCES, ENOSPC reported as such); then the
 * estimated checkpoint size is checked against free space and ulimit -f as each save
 * does. *lock_fd is rank 0's lock descriptor (-1 elsewhere) for checkpoint_dir_close. */
int checkpoint_dir_open(fsdp_engine *e, const topology *topo, const job_config *cfg,
                        const hf_files *hf, int *lock_fd, char *err, size_t errlen);
/* Releases the lock (local; safe with -1). */
void checkpoint_dir_close(int *lock_fd);

/* Loads path into the engine (collective), checking the model shape and every
 * checksum of what it reads; fills *st (may be NULL). Rank 0 prints one line. */
int checkpoint_load(fsdp_engine *e, const topology *topo, const model_shape *mc,
                    const char *path, ckpt_load_what what, ckpt_state *st, char *err,
                    size_t errlen);

/* Where to resume from: resume = "none" -> ""; "auto" -> the file <dir>/latest names,
 * or "" when dir is empty or has no `latest`; otherwise a checkpoint file, or a
 * directory whose `latest` is used. path receives "" or a file path. A `latest` that is
 * a link (dangling or not), not one line "step_<N>.h5", or names a file that cannot be
 * read is an error, never "no checkpoint". */
int checkpoint_resolve(const char *dir, const char *resume, char *path, size_t pathlen,
                       char *err, size_t errlen);

/* Loads the weights of a Hugging Face model directory (config.json, model.safetensors
 * or model.safetensors.index.json + shards) into the engine, each rank reading only the
 * ranges its shard needs; refuses a config.json whose shape differs from mc. */
int checkpoint_import_hf(fsdp_engine *e, const topology *topo, const model_shape *mc,
                         const char *dir, char *err, size_t errlen);
/* Loads a PEFT adapter directory's adapter_model.safetensors (io/peft_adapter.h: keys
 * PEFT_KEY_PREFIX + the adapter's name) into the engine's adapters (LoRA), refusing a
 * tensor the job's adapters do not have and a shape other than theirs. Collective. */
int checkpoint_import_peft(fsdp_engine *e, const topology *topo, const char *dir, char *err,
                           size_t errlen);

/* model.init_from: a Hugging Face directory, or a shardlm checkpoint file/directory
 * (weights only). */
int checkpoint_init_from(fsdp_engine *e, const topology *topo, const model_shape *mc,
                         const char *src, char *err, size_t errlen);

/* ---- for `shardlm ckpt` and tests ---- */
struct ckpt_h5_file;

/* Opens a checkpoint read-only over comm (collective), checks that it is a shardlm
 * checkpoint of a format version this build reads, and reads its model shape and
 * training state (either may be NULL), before anything is allocated from them: every
 * state attribute within its bounds (the job key's of the same name where there is one),
 * consistent with the others, and (format 2) the state checksum over the state and every
 * dataset's path, shape and checksum matching; a dataset reached through a soft,
 * external or second hard link is refused. */
int checkpoint_open(struct ckpt_h5_file *f, const char *path, MPI_Comm comm,
                    model_shape *shape, ckpt_state *st, char *err, size_t errlen);

/* The Hugging Face files kept in an open checkpoint (its /hf group; none in files of
 * format 2 and older) added to out where out lacks them, every checksum checked.
 * Collective. */
int checkpoint_read_hf(struct ckpt_h5_file *f, hf_files *out, char *err, size_t errlen);
/* The same for the checkpoint file path (opened and closed here). */
int checkpoint_read_hf_path(const char *path, MPI_Comm comm, hf_files *out, char *err,
                            size_t errlen);

/* checkpoint_open, then close: the state of path (collective). */
int checkpoint_read_state(const char *path, MPI_Comm comm, ckpt_state *st, char *err,
                          size_t errlen);

/* 0 when the stored shape equals mc's, else -1 with a message naming the first [model]
 * key that differs (a different model is refused, never loaded). Local. */
int checkpoint_check_shape(const char *path, const model_shape *stored,
                           const model_shape *mc, char *err, size_t errlen);

#endif
