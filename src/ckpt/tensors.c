/* The datasets of a checkpoint (tensors.h) and which rank moves which piece of them. */
#include "src/ckpt/tensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "src/ckpt/ckpt_internal.h"
#include "src/engine/adapters.h"

const char *const checkpoint_groups[FSDP_STATE_N] = {"/model", "/optim/exp_avg",
                                                     "/optim/exp_avg_sq"};

void ckpt_tensors_of_layout(ckpt_tensors *l, const model_layout *lay) {
    int total = 0;
    for (int u = 0; u < lay->n_units; u++) total += lay->units[u].n_tensors;
    l->list = malloc((size_t)total * sizeof *l->list);
    SHLM_CHECK_ALLOC(l->list);
    int k = 0;
    for (int u = 0; u < lay->n_units; u++)
        for (int i = 0; i < lay->units[u].n_tensors; i++)
            l->list[k++] = (ckpt_tensor){u, &lay->units[u].tensors[i]};
    l->n = total;
    l->owns_desc = 0;
}

void ckpt_tensors_of_shape(ckpt_tensors *l, const model_shape *shape, const ckpt_state *st) {
    model_desc md;
    model_shape_desc_open(&md, shape);
    if (st && st->lora_rank > 0) {
        const lora_config lc = {.rank = st->lora_rank, .alpha = 1, .targets = (unsigned)st->lora_targets,
                                .dora = st->lora_dora};
        adapters_open(&md, &lc);
    }
    l->md = md; /* the layout's units live on the heap: the list's pointers stay valid */
    ckpt_tensors_of_layout(l, model_desc_trained(&l->md));
    l->owns_desc = 1;
}

void ckpt_tensors_free(ckpt_tensors *l) {
    free(l->list);
    l->list = NULL;
    l->n = 0;
    if (l->owns_desc) model_desc_close(&l->md);
    l->owns_desc = 0;
}

void ckpt_dataset_path(const ckpt_tensors *l, int k, int i, char *path, size_t pathlen) {
    snprintf(path, pathlen, "%s/%s", checkpoint_groups[k], l->list[i].t->name);
}

int ckpt_open_dataset(ckpt_h5_file *f, const ckpt_tensors *l, int k, int i,
                      ckpt_h5_dataset *d, uint64_t *checksum, char *err, size_t errlen) {
    char path[256];
    ckpt_dataset_path(l, k, i, path, sizeof path);
    if (ckpt_h5_open_dataset(f, path, d, err, errlen) != 0) return -1;
    if (checksum && ckpt_h5_attr_read_u64(f, path, "checksum", checksum, err, errlen) != 0) {
        ckpt_h5_close_dataset(d);
        return -1;
    }
    return 0;
}

int ckpt_read_chunks(ckpt_h5_file *f, ckpt_h5_dataset *d, uint64_t lo, uint64_t hi,
                     uint64_t n_calls, float *buf, ckpt_chunk_fn fn, void *ctx, char *err,
                     size_t errlen) {
    int ok = 1;
    for (uint64_t c = 0; c < n_calls; c++) {
        uint64_t a = lo + c * CKPT_CHUNK_ELEMS;
        uint64_t cnt = a < hi ? (hi - a < CKPT_CHUNK_ELEMS ? hi - a : CKPT_CHUNK_ELEMS) : 0;
        if (cnt == 0) a = 0;
        /* keep joining the collective reads after a local failure, so no rank hangs */
        if (ckpt_h5_read_range(f, d, a, ok ? cnt : 0, buf, err, errlen) != 0) ok = 0;
        else if (ok && cnt && fn && fn(ctx, buf, a, cnt, err, errlen) != 0) ok = 0;
    }
    return ok ? 0 : -1;
}

/* ---------------------------------------------------------------- pieces */

void ckpt_my_piece(fsdp_engine *e, const topology *t, int u, size_t *begin, size_t *end) {
    size_t b, en;
    fsdp_shard_range(e, u, &b, &en);
    const size_t n = en - b, R = (size_t)t->replica_size, j = (size_t)t->replica_rank;
    *begin = b + n * j / R;
    *end = b + n * (j + 1) / R;
}

size_t ckpt_max_shard_numel(fsdp_engine *e) {
    size_t m = 1;
    for (int u = 0; u < fsdp_layout(e)->n_units; u++) {
        size_t b, en;
        fsdp_shard_range(e, u, &b, &en);
        if (en - b > m) m = en - b;
    }
    return m;
}

uint64_t ckpt_layout_bytes(const model_layout *lay, int kinds) {
    uint64_t b = 0;
    for (int u = 0; u < lay->n_units; u++)
        for (int i = 0; i < lay->units[u].n_tensors; i++)
            b += lay->units[u].tensors[i].numel * sizeof(float);
    return b * (uint64_t)kinds;
}

ckpt_shape_text ckpt_shape_str(int ndim, const int64_t *shape) {
    ckpt_shape_text t = {"["};
    for (int i = 0; i < ndim; i++)
        snprintf(t.s + strlen(t.s), sizeof t.s - strlen(t.s), "%s%lld", i ? ", " : "",
                 (long long)shape[i]);
    snprintf(t.s + strlen(t.s), sizeof t.s - strlen(t.s), "]");
    return t;
}
