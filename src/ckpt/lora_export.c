/* The merge of a LoRA checkpoint's adapters into their base (lora_export.h). */
#include "src/ckpt/lora_export.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "io/errmsg.h"
#include "io/hf_model.h"
#include "kernels/bf16.h"
#include "kernels/check.h"
#include "src/base/agree.h"
#include "src/base/rng.h"
#include "src/ckpt/ckpt_internal.h"
#include "src/ckpt/tensors.h"
#include "src/engine/adapters.h"

struct lora_merge {
    hf_weights w;          /* the base's safetensors (rank 0) */
    int w_open;
    ckpt_tensors ad;       /* the checkpoint's adapter tensors */
    float **val;           /* (ad.n) rank 0: each adapter tensor, whole */
    float scale;           /* lora_scale */
};

/* Rank 0: tensor t of the base into out (t->numel), its shape checked. 0, or -1. */
static int read_base(hf_weights *w, const model_tensor *t, float *out, char *err,
                     size_t errlen) {
    safetensors_file *sf;
    const safetensors_tensor *st;
    if (hf_weights_find(w, t->name, &sf, &st, err, errlen) != 0) return -1;
    if (st->ndim != t->ndim || st->shape[0] != t->shape[0] ||
        (t->ndim == 2 && st->shape[1] != t->shape[1])) {
        io_set_err(err, errlen, "%s: tensor %s has shape %s, the checkpoint's model has %s",
                   sf->path, t->name, ckpt_shape_str(st->ndim, st->shape).s,
                   ckpt_shape_str(t->ndim, t->shape).s);
        return -1;
    }
    return safetensors_read_f32(sf, st, 0, t->numel, out, err, errlen);
}

/* Rank 0: the base's fingerprints, every unit laid out flat as the engine holds it (the
 * gaps zero): of the values read (fp32) and of their bf16 rounding. */
static int base_fingerprints(hf_weights *w, const model_shape *m, uint64_t *h32, uint64_t *h16,
                             char *err, size_t errlen) {
    model_desc md;
    model_shape_desc_open(&md, m);
    const model_layout *lay = &md.lay;
    size_t most = 1;
    for (int u = 0; u < lay->n_units; u++)
        if (lay->units[u].numel > most) most = lay->units[u].numel;
    float *buf = malloc(most * sizeof(float));
    SHLM_CHECK_ALLOC(buf);
    int rc = 0;
    uint64_t at = 0;
    *h32 = *h16 = 0;
    for (int u = 0; rc == 0 && u < lay->n_units; u++) {
        const model_unit *lu = &lay->units[u];
        memset(buf, 0, lu->numel * sizeof(float));
        for (int i = 0; rc == 0 && i < lu->n_tensors; i++)
            rc = read_base(w, &lu->tensors[i], buf + lu->tensors[i].offset, err, errlen);
        if (rc != 0) break;
        *h32 += rng_fingerprint_f32(at, buf, lu->numel);
        for (size_t i = 0; i < lu->numel; i++) buf[i] = shlm_bf16_to_f32(shlm_f32_to_bf16(buf[i]));
        *h16 += rng_fingerprint_f32(at, buf, lu->numel);
        at += lu->numel;
    }
    free(buf);
    model_desc_close(&md);
    return rc;
}

/* A chunk of an adapter tensor into its buffer, summed for its checksum. */
typedef struct keep_sink {
    float *dst;
    ckpt_h5_sum sum;
} keep_sink;

static int keep_chunk(void *ctx, const float *x, uint64_t first, uint64_t count, char *err,
                      size_t errlen) {
    (void)err, (void)errlen;
    keep_sink *k = ctx;
    ckpt_h5_sum_add(&k->sum, x, first, count);
    memcpy(k->dst + first, x, count * sizeof(float));
    return 0;
}

/* Every adapter tensor into lm->val on rank 0 (the others join each collective read),
 * each checked against its checksum. 0, or -1 with err on every rank. */
static int read_adapters(lora_merge *lm, ckpt_h5_file *f, const char *path, int me, char *err,
                         size_t errlen) {
    float *buf = malloc((size_t)CKPT_CHUNK_ELEMS * sizeof(float));
    SHLM_CHECK_ALLOC(buf);
    int ok = 1;
    for (int i = 0; ok && i < lm->ad.n; i++) {
        ckpt_h5_dataset d;
        uint64_t stored = 0;
        ok = ckpt_open_dataset(f, &lm->ad, FSDP_STATE_MASTER, i, &d, &stored, err, errlen) == 0;
        if (ranks_agree(MPI_COMM_WORLD, ok, err, errlen) != 0) {
            ckpt_h5_close_dataset(&d);
            ok = 0;
            break;
        }
        keep_sink k = {NULL, {0, 0}};
        if (me == 0) {
            k.dst = lm->val[i] = malloc((d.numel ? d.numel : 1) * sizeof(float));
            SHLM_CHECK_ALLOC(k.dst);
        }
        const uint64_t calls = (d.numel + CKPT_CHUNK_ELEMS - 1) / CKPT_CHUNK_ELEMS;
        ok = ckpt_read_chunks(f, &d, 0, me == 0 ? d.numel : 0, calls, buf,
                              me == 0 ? keep_chunk : NULL, &k, err, errlen) == 0;
        if (ok && me == 0 && ckpt_h5_sum_final(&k.sum, d.numel) != stored) {
            io_set_err(err, errlen, "%.1000s: dataset %.256s is corrupt: checksum mismatch", path,
                       d.path);
            ok = 0;
        }
        ckpt_h5_close_dataset(&d);
        ok = ranks_agree(MPI_COMM_WORLD, ok, err, errlen) == 0;
    }
    free(buf);
    return ok ? 0 : -1;
}

int lora_merge_open(lora_merge **out, ckpt_h5_file *f, const char *path, const model_shape *m,
                    const ckpt_state *st, const char *base_dir, char *err, size_t errlen) {
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    lora_merge *lm = calloc(1, sizeof *lm);
    SHLM_CHECK_ALLOC(lm);
    *out = NULL;
    const lora_config lc = {.rank = st->lora_rank, .alpha = st->lora_alpha,
                            .targets = (unsigned)st->lora_targets, .rslora = st->lora_rslora,
                            .dora = st->lora_dora};
    lm->scale = lora_scale(&lc);
    int ok = 1;
    if (me == 0) {
        ok = hf_weights_open(&lm->w, base_dir, err, errlen) == 0;
        lm->w_open = ok;
        uint64_t h32 = 0, h16 = 0;
        if (ok) ok = base_fingerprints(&lm->w, m, &h32, &h16, err, errlen) == 0;
        if (ok && h32 != st->lora_base_fingerprint && h16 != st->lora_base_fingerprint) {
            io_set_err(err, errlen, "%.600s: this base has fingerprint %016llx (%016llx in bf16), "
                       "but %.600s was trained on the base %.600s, fingerprint %016llx: merge "
                       "into that base (--base DIR)", base_dir, (unsigned long long)h32,
                       (unsigned long long)h16, path, st->lora_base,
                       (unsigned long long)st->lora_base_fingerprint);
            ok = 0;
        }
    }
    ckpt_tensors_of_shape(&lm->ad, m, st);
    lm->val = calloc((size_t)lm->ad.n, sizeof *lm->val);
    SHLM_CHECK_ALLOC(lm->val);
    if (ranks_agree(MPI_COMM_WORLD, ok, err, errlen) != 0 ||
        read_adapters(lm, f, path, me, err, errlen) != 0) {
        lora_merge_close(lm);
        return -1;
    }
    *out = lm;
    return 0;
}

/* The adapter tensor "P" + suffix of projection P in lm's list, or NULL. */
static const float *adapter(const lora_merge *lm, const char *proj, size_t plen,
                            const char *suffix, const model_tensor **t) {
    for (int i = 0; i < lm->ad.n; i++) {
        const char *name = lm->ad.list[i].t->name;
        if (strncmp(name, proj, plen) == 0 && strcmp(name + plen, suffix) == 0) {
            *t = lm->ad.list[i].t;
            return lm->val[i];
        }
    }
    return NULL;
}

int lora_merge_tensor(lora_merge *lm, const model_tensor *t, float *out, char *err,
                      size_t errlen) {
    if (read_base(&lm->w, t, out, err, errlen) != 0) return -1;
    const size_t n = strlen(t->name);
    if (n <= 7 || strcmp(t->name + n - 7, ".weight") != 0) return 0;
    const model_tensor *ta, *tb, *tm;
    const float *a = adapter(lm, t->name, n - 7, ".lora_A.weight", &ta);
    const float *b = adapter(lm, t->name, n - 7, ".lora_B.weight", &tb);
    if (!a || !b) return 0; /* not adapted */
    const float *mag = adapter(lm, t->name, n - 7, ".lora_magnitude_vector", &tm);
    const int rows = (int)t->shape[0], cols = (int)t->shape[1], r = (int)ta->shape[0];
    /* PEFT's get_delta_weight: (B·A)·s in fp32, added to the weight */
    float *delta = malloc((size_t)rows * cols * sizeof(float));
    SHLM_CHECK_ALLOC(delta);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, cols, r, 1.0f, b, r, a, cols,
                0.0f, delta, cols);
    for (int o = 0; o < rows; o++) {
        float *w = out + (size_t)o * cols;
        const float *dw = delta + (size_t)o * cols;
        double n2 = 0;
        for (int c = 0; c < cols; c++) {
            w[c] += dw[c] * lm->scale;
            n2 += (double)w[c] * w[c];
        }
        if (!mag) continue;
        /* DoRA (PEFT's DoraLinearVariant.merge): the magnitude over the row's norm */
        const float g = mag[o] / (float)sqrt(n2);
        for (int c = 0; c < cols; c++) w[c] *= g;
    }
    free(delta);
    return 0;
}

void lora_merge_close(lora_merge *lm) {
    if (!lm) return;
    for (int i = 0; lm->val && i < lm->ad.n; i++) free(lm->val[i]);
    free(lm->val);
    ckpt_tensors_free(&lm->ad);
    if (lm->w_open) hf_weights_close(&lm->w);
    free(lm);
}
