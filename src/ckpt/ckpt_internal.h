/* What the files of src/ckpt/ share with each other; nothing outside src/ckpt/ includes
 * it (checkpoint.h is the API; tensors.h, the dataset list, is `shardlm ckpt`'s too). */
#ifndef SHLM_CKPT_INTERNAL_H
#define SHLM_CKPT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/ckpt_hdf5.h"
#include "src/ckpt/checkpoint.h"

/* ---- the state record (state.c) ---- */

/* 2: the state checksum, skipped_in_a_row, lr_decay_from, lr_decay_lr; 3:
 * model.tie_word_embeddings (older files are untied) and the /hf group of Hugging Face
 * files; 4: model.family and every [model] key of that family (older files are Llama
 * shapes: the keys of version 3, the others at their defaults), and data.train,
 * data.train_bytes, data.train_fingerprint (the training file); 5: the RoPE scaling keys,
 * data.train_sources, lora.rank, lora.targets, lora.dora, lora.base,
 * lora.base_fingerprint; 6: lora.alpha, lora.rslora, lora.dropout (what an export of the
 * adapters needs); every older version is read too (version 1's state range-checked,
 * without a checksum to compare) */
enum { CKPT_FORMAT_VERSION = 6, CKPT_FORMAT_OLDEST = 1 };

/* The group of the Hugging Face files kept for export (format 3 on). */
#define CKPT_HF_GROUP "/hf"
/* What a value that no save writes means, at the end of the message saying so. */
#define CKPT_CORRUPT "(a corrupt or edited checkpoint)"

/* What the root attributes of the state, the sharding and the shape hold. */
typedef struct ckpt_record {
    ckpt_state st;
    model_shape m;
} ckpt_record;

/* A dataset of the checkpoint as the state checksum sees it. */
typedef struct ckpt_ds_entry {
    char path[256];
    int ndim;
    int64_t shape[2];
    uint64_t checksum;
} ckpt_ds_entry;

/* Whether every field of r lies in its bounds (the job key's of the same name where there
 * is one) and the fields agree with each other; else -1 with the first problem, followed
 * by suffix (what it means for the caller). Local. */
int ckpt_record_check(const char *path, const ckpt_record *r, const char *suffix, char *err,
                      size_t errlen);
/* Reads every state attribute and the shape of a file of format `version` into *r,
 * unchecked but for what a C type cannot hold. Local. */
int ckpt_record_read(ckpt_h5_file *f, int version, ckpt_record *r, char *err, size_t errlen);
/* Writes the root attributes of a save: the record, a state checksum of 0 (rewritten
 * once the datasets' checksums are known), and what is only informative: versions, the time,
 * the job's text and path, AdamW's hyper-parameters. Collective (HDF5 metadata). */
int ckpt_root_attrs_write(ckpt_h5_file *f, const ckpt_record *rec, const job_config *cfg,
                          char *err, size_t errlen);
/* The state checksum of a record of format `version` and the datasets ds (sorted here by
 * path): the attribute state_checksum_text describes it. */
uint64_t ckpt_state_checksum(const ckpt_record *r, int version, ckpt_ds_entry *ds, int n);

/* ---- which rank moves which piece (tensors.c) ---- */

/* The piece of this rank's shard of unit u that it writes on save and checksums on
 * load: the shard split into replica_size pieces, so that replicas, which hold the same
 * shard, move each byte once. */
void ckpt_my_piece(fsdp_engine *e, const topology *t, int u, size_t *begin, size_t *end);
/* The most elements of one unit's shard on this rank (at least 1): the staging buffer. */
size_t ckpt_max_shard_numel(fsdp_engine *e);
/* The bytes of the model's tensors, `kinds` state kinds of them. */
uint64_t ckpt_layout_bytes(const model_layout *lay, int kinds);

/* A tensor's shape for messages: "[16]", "[64, 256]". */
typedef struct ckpt_shape_text {
    char s[96];
} ckpt_shape_text;
ckpt_shape_text ckpt_shape_str(int ndim, const int64_t *shape);

/* A byte count for messages: "2.638 GB", "1.13 MB", "228.5 kB". */
typedef struct ckpt_bytes_text {
    char s[32];
} ckpt_bytes_text;
static inline ckpt_bytes_text ckpt_bytes_str(double b) {
    ckpt_bytes_text h;
    if (b >= 1e9) snprintf(h.s, sizeof h.s, "%.3f GB", b / 1e9);
    else if (b >= 1e6) snprintf(h.s, sizeof h.s, "%.2f MB", b / 1e6);
    else snprintf(h.s, sizeof h.s, "%.1f kB", b / 1e3);
    return h;
}

/* ---- deadlines (guard.c) ---- */

/* Begins the guarded region `what` (kernels/comm/comm_watchdog.h) of an operation that
 * moves `bytes`; shlm_guard_end ends it. */
void ckpt_guard_begin(const char *what, uint64_t bytes);
/* The last component of path, for the watchdog's short texts. */
const char *ckpt_base_name(const char *path);

/* ---- the directory's files (dir.c): rank 0, local ---- */

/* Whether a file of `need` bytes fits before a byte is written: the file-size limit of
 * this process (ulimit -f) on every rank, free space on rank 0. */
int ckpt_dir_check_space(const char *dir, int rank, uint64_t need, char *err, size_t errlen);
/* Renames tmp to final (fsynced) and points <dir>/latest at name, the file name of
 * final. */
int ckpt_dir_commit(const char *dir, const char *tmp, const char *final, const char *name,
                    char *err, size_t errlen);
/* Removes what failed saves left and, with keep > 0, the step_*.h5 beyond the newest keep
 * (never saved's); problems are printed, not fatal. */
void ckpt_dir_prune(const char *dir, int keep, int64_t saved);

/* ---- the save (save.c) ---- */

/* A save's data copied out of the engine at the step it saves (async.c): this rank's shard
 * of unit u of state kind k, fsdp_shard_range's elements, at shard[k * n_units + u]. */
typedef struct ckpt_staging {
    float **shard;  /* (FSDP_STATE_N * n_units) */
    int n_units;
} ckpt_staging;

/* checkpoint_save over comm (the world, or a duplicate of it that only one thread of each
 * rank uses), its data from staged where that is not NULL (the engine is then only asked
 * for its layout and shard ranges, never for its data: another thread may train on it).
 * Collective over comm. */
int ckpt_save_over(fsdp_engine *e, const topology *topo, const job_config *cfg,
                   const ckpt_state *st, const hf_files *hf, const char *dir, int keep,
                   MPI_Comm comm, const ckpt_staging *staged, char *err, size_t errlen);

/* An upper bound of the size of the file a save of e's state with the job's [checkpoint]
 * options and the kept files hf writes: data, alignment gaps, metadata, hf. Local. */
uint64_t ckpt_save_bytes(fsdp_engine *e, const job_config *cfg, const hf_files *hf);

/* ---- test hooks (faults.c; checkpoint.h names them) ---- */

/* SHLM_TEST_STOP_IN_SAVE: stops this rank once the save's file exists. */
void ckpt_fault_save_created(int rank, int64_t step);
/* SHLM_TEST_KILL_IN_SAVE: kills this rank once it has written half of the save's
 * datasets (done of total, into file). */
void ckpt_fault_save_dataset_written(int rank, int64_t step, int done, int total,
                                     const char *file);
/* SHLM_TEST_WRITE_ERROR: once this rank has written `done` of the save's `total`
 * datasets, half of them, into file, its write fails (*ok = 0, err naming file), as a
 * disk's error would. */
void ckpt_fault_save_write_error(int rank, int64_t step, int done, int total,
                                 const char *file, int *ok, char *err, size_t errlen);
/* SHLM_TEST_SLOW_SAVE: makes this rank take twice runtime.comm_timeout_s more to write. */
void ckpt_fault_save_data_written(int rank, int64_t step);
/* SHLM_TEST_STOP_IN_LOAD: stops this rank once the load has opened its file. */
void ckpt_fault_load_opened(int rank);
/* SHLM_TEST_NO_SPACE_CHECK=1: 1 when the space check is off (to fill a disk mid-save). */
int ckpt_fault_no_space_check(void);

#endif
