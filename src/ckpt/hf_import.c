/* Hugging Face weights into the engine: model.init_from of a Hugging Face directory
 * (config.json checked against the job's shape, each rank reading only the safetensors
 * ranges its shard needs), or of a shardlm checkpoint. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/errmsg.h"
#include "io/hf_model.h"
#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "src/base/agree.h"
#include "src/base/shard.h"
#include "src/ckpt/ckpt_internal.h"
#include "src/families/families.h"

/* The number of elements of x[0, n) that are NaN or infinite. */
static uint64_t count_nonfinite(const float *x, size_t n) {
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    return bad;
}

static int layout_has(const model_layout *lay, const char *name) {
    for (int u = 0; u < lay->n_units; u++)
        for (int k = 0; k < lay->units[u].n_tensors; k++)
            if (strcmp(lay->units[u].tensors[k].name, name) == 0) return 1;
    return 0;
}

/* Every tensor of the safetensors must be one the model reads: a parameter of the
 * layout, or one the family knows to be redundant (its hf_unused: a tied model's
 * lm_head.weight, RoPE's saved frequencies), which is skipped with a warning (printed when
 * `say`). Anything else is refused: a name this model does not have means another model.
 * Local. */
static int check_hf_names(const hf_weights *w, const model_layout *lay, const model_shape *m,
                          int say, char *err, size_t errlen) {
    for (int f = 0; f < w->n_files; f++) {
        const safetensors_file *sf = &w->files[f];
        for (int i = 0; i < sf->n_tensors; i++) {
            const char *name = sf->tensors[i].name;
            if (layout_has(lay, name)) continue;
            const char *why = m->family->hf_unused(model_shape_cdata(m), name);
            if (!why) {
                io_set_err(err, errlen, "%s: tensor %s is not a parameter of this %s model: "
                           "refusing a file of another model", sf->path, name, m->family->name);
                return -1;
            }
            if (say)
                fprintf(stderr, "shardlm: warning: %s: tensor %s is not used: %s\n", sf->path,
                        name, why);
        }
    }
    return 0;
}

/* Whether config.json (its shape hc) says what the job's shape mc says of every key it
 * holds: 1, else 0 with err naming the first key that differs. Local. */
static int config_matches(const char *dir, const model_shape *hc, const model_shape *mc,
                          char *err, size_t errlen) {
    if (hc->family != mc->family) {
        io_set_err(err, errlen, "%s/config.json is a %s model but the job's is a %s model", dir,
                   hc->family->name, mc->family->name);
        return 0;
    }
    const model_family *fam = mc->family;
    for (int i = 0; i < fam->n_keys; i++) {
        if (!fam->hf_names[i] ||
            key_equal(&fam->keys[i], model_shape_cdata(hc), model_shape_cdata(mc)))
            continue;
        char theirs[64], mine[64];
        key_format(&fam->keys[i], model_shape_cdata(hc), theirs, sizeof theirs);
        key_format(&fam->keys[i], model_shape_cdata(mc), mine, sizeof mine);
        io_set_err(err, errlen, "%s/config.json: %s = %s but the job's [model] %s = %s: the job "
                   "must describe the same model (set %s = %s)", dir, fam->hf_names[i], theirs,
                   fam->keys[i].key, mine, fam->keys[i].key, theirs);
        return 0;
    }
    return 1;
}

/* Reads the range of tensor t that this rank's shard [sb, se) of its unit overlaps into
 * buf (the shard), refusing a shape other than the model's and a value that is not
 * finite; *bytes grows by what was read. 1, else 0 with err. Local. */
static int read_tensor(hf_weights *w, const model_tensor *t, float *buf, size_t sb, size_t se,
                       uint64_t *bytes, char *err, size_t errlen) {
    shard_overlap ov;
    if (!shard_intersect(sb, se, t->offset, t->numel, &ov)) return 1;
    const char *name = t->name; /* tied: the layout has no lm_head.weight */
    safetensors_file *sf;
    const safetensors_tensor *st;
    int ok = hf_weights_find(w, name, &sf, &st, err, errlen) == 0;
    if (ok && (st->ndim != t->ndim || st->shape[0] != t->shape[0] ||
               (t->ndim == 2 && st->shape[1] != t->shape[1]))) {
        io_set_err(err, errlen, "%s: tensor %s has shape %s, the model needs %s", sf->path,
                   name, ckpt_shape_str(st->ndim, st->shape).s,
                   ckpt_shape_str(t->ndim, t->shape).s);
        ok = 0;
    }
    if (ok)
        ok = safetensors_read_f32(sf, st, ov.tensor_offset, ov.count,
                                  buf + (ov.flat_offset - sb), err, errlen) == 0;
    /* after the conversion to fp32: an F64 beyond FLT_MAX is infinite too */
    const uint64_t bad = ok ? count_nonfinite(buf + (ov.flat_offset - sb), ov.count) : 0;
    if (bad) {
        io_set_err(err, errlen, "%s: tensor %s holds %llu non-finite values (NaN or "
                   "infinite) in elements [%llu, %llu): refusing to load it", sf->path, name,
                   (unsigned long long)bad, (unsigned long long)ov.tensor_offset,
                   (unsigned long long)(ov.tensor_offset + ov.count));
        ok = 0;
    }
    *bytes += ov.count * sizeof(float);
    return ok;
}

static int import_hf(fsdp_engine *e, const topology *topo, const model_shape *mc,
                     const char *dir, char *err, size_t errlen) {
    MPI_Comm comm = topo->world;
    const double t0 = MPI_Wtime();
    model_shape hc;
    int ok = family_shape_from_hf(dir, &hc, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) return -1;
    ok = config_matches(dir, &hc, mc, err, errlen);
    if (ranks_agree(comm, ok, err, errlen)) return -1;

    hf_weights w;
    ok = hf_weights_open(&w, dir, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) return -1;
    const model_layout *lay = fsdp_layout(e);
    ok = check_hf_names(&w, lay, &hc, topo->world_rank == 0, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) {
        hf_weights_close(&w);
        return -1;
    }
    float *buf = malloc(ckpt_max_shard_numel(e) * sizeof(float));
    SHLM_CHECK_ALLOC(buf);
    uint64_t bytes = 0;
    for (int u = 0; u < lay->n_units; u++) { /* each unit's shard, read whole, then set */
        size_t sb, se;
        fsdp_shard_range(e, u, &sb, &se);
        memset(buf, 0, (se - sb) * sizeof(float));
        const model_unit *lu = &lay->units[u];
        for (int i = 0; ok && i < lu->n_tensors; i++)
            ok = read_tensor(&w, &lu->tensors[i], buf, sb, se, &bytes, err, errlen);
        if (ranks_agree(comm, ok, err, errlen)) {
            ok = 0;
            break;
        }
        fsdp_set_state(e, u, FSDP_STATE_MASTER, buf);
    }
    hf_weights_close(&w);
    free(buf);
    if (!ok) return -1;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_UINT64_T, MPI_SUM, comm));
    if (topo->world_rank == 0) {
        double dt = MPI_Wtime() - t0;
        printf("checkpoint: imported Hugging Face weights from %s: %s read by %d ranks in %.3f s "
               "= %.2f GB/s\n", dir, ckpt_bytes_str((double)bytes).s, topo->world_size, dt,
               bytes / 1e9 / dt);
        fflush(stdout);
    }
    return 0;
}

int checkpoint_import_hf(fsdp_engine *e, const topology *topo, const model_shape *mc,
                         const char *dir, char *err, size_t errlen) {
    char what[200];
    snprintf(what, sizeof what, "import of the Hugging Face weights in %s", ckpt_base_name(dir));
    ckpt_guard_begin(what, ckpt_layout_bytes(fsdp_layout(e), 1));
    const int rc = import_hf(e, topo, mc, dir, err, errlen);
    shlm_guard_end();
    return rc;
}

int checkpoint_init_from(fsdp_engine *e, const topology *topo, const model_shape *mc,
                         const char *src, char *err, size_t errlen) {
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/config.json", src);
    int hf = access(cfg, R_OK) == 0;
    ckpt_guard_begin("finding the weights to load", 0);
    MPI_CHECK(MPI_Bcast(&hf, 1, MPI_INT, 0, topo->world));
    shlm_guard_end();
    if (hf) return checkpoint_import_hf(e, topo, mc, src, err, errlen);
    char path[2048];
    if (checkpoint_resolve("", src, path, sizeof path, err, errlen) != 0) return -1;
    return checkpoint_load(e, topo, mc, path, CKPT_LOAD_WEIGHTS, NULL, err, errlen);
}
