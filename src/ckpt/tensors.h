/* The datasets of a checkpoint: one per tensor of the model's layout and state kind, named
 * <group of the kind>/<Hugging Face name>, listed in (unit, tensor) order. The one list
 * that saving, loading, the state checksum and `shardlm ckpt` walk. */
#ifndef SHLM_CKPT_TENSORS_H
#define SHLM_CKPT_TENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "io/ckpt_hdf5.h"
#include "src/engine/fsdp.h"
#include "src/engine/model.h"
#include "src/model/family.h"

/* The groups of the state kinds, in fsdp_state_kind order: "/model", "/optim/exp_avg",
 * "/optim/exp_avg_sq". */
extern const char *const checkpoint_groups[FSDP_STATE_N];

/* One tensor of the list. */
typedef struct ckpt_tensor {
    int unit;               /* the layout unit that holds it */
    const model_tensor *t;  /* in the layout the list was made from */
} ckpt_tensor;

typedef struct ckpt_tensors {
    int n;
    ckpt_tensor *list;      /* (n) */
    model_desc md;          /* ckpt_tensors_of_shape's layout */
    int owns_desc;
} ckpt_tensors;

/* The tensors of a layout (the engine's); lay must outlive the list. */
void ckpt_tensors_of_layout(ckpt_tensors *l, const model_layout *lay);
/* The tensors of a model shape (a checkpoint's), described here; shape must outlive the
 * list. st: the checkpoint's state, or NULL; a LoRA checkpoint's (st->lora_rank > 0)
 * tensors are its adapters (src/engine/adapters.h). */
struct ckpt_state;
void ckpt_tensors_of_shape(ckpt_tensors *l, const model_shape *shape,
                           const struct ckpt_state *st);
void ckpt_tensors_free(ckpt_tensors *l);

/* The dataset of tensor i in state kind k: writes its path, "GROUP/NAME", into path. */
void ckpt_dataset_path(const ckpt_tensors *l, int k, int i, char *path, size_t pathlen);

/* Opens the dataset of tensor i in state kind k (reached through plain links only,
 * io/ckpt_hdf5.h; its path in d->path) and, where checksum is not NULL, reads its stored
 * checksum. -1 with the message in err. Local. */
int ckpt_open_dataset(ckpt_h5_file *f, const ckpt_tensors *l, int k, int i,
                      ckpt_h5_dataset *d, uint64_t *checksum, char *err, size_t errlen);

/* Elements moved per read of a whole dataset: bounds memory for 70B-sized tensors. */
enum { CKPT_CHUNK_ELEMS = 1 << 24 };

/* What ckpt_read_chunks calls on each chunk read: elements [first, first + count). 0, or -1
 * with err. */
typedef int (*ckpt_chunk_fn)(void *ctx, const float *x, uint64_t first, uint64_t count,
                             char *err, size_t errlen);

/* Reads dataset d's elements [lo, hi) in chunks through buf (CKPT_CHUNK_ELEMS floats),
 * collectively: every rank makes the same number of calls (n_calls), each rank's range
 * may be empty. Calls fn (when not NULL) on every chunk read. 0, or -1 with err (this
 * rank's failure; the rank still joined every read). */
int ckpt_read_chunks(ckpt_h5_file *f, ckpt_h5_dataset *d, uint64_t lo, uint64_t hi,
                     uint64_t n_calls, float *buf, ckpt_chunk_fn fn, void *ctx, char *err,
                     size_t errlen);

#endif
