/* LoRA's adapter layout, scale and initial values (adapters.h). */
#include "src/engine/adapters.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "src/base/rng.h"

/* The projection's name: the base weight's name without ".weight". */
static int projection_name(const model_tensor *t, char *out, size_t outlen) {
    const size_t n = strlen(t->name);
    const size_t k = n > 7 && strcmp(t->name + n - 7, ".weight") == 0 ? n - 7 : n;
    return snprintf(out, outlen, "%.*s", (int)k, t->name);
}

static void add(model_unit *u, const char *proj, const char *suffix, int64_t rows, int64_t cols,
                int decay, int target) {
    if (u->n_tensors >= MODEL_MAX_UNIT_TENSORS)
        SHLM_FATAL("adapters: more than %d adapter tensors in one unit", MODEL_MAX_UNIT_TENSORS);
    model_tensor *t = &u->tensors[u->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s.%s", proj, suffix);
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 0;
    t->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    t->offset = u->numel;
    t->weight_decay = decay;
    t->target = target;
    u->numel += t->numel;
}

void adapters_layout(const model_layout *lay, const lora_config *lc, model_layout *adapters,
                     lora_product (**products)[MODEL_MAX_FP8_WEIGHTS]) {
    adapters->n_units = lay->n_units;
    adapters->units = calloc((size_t)lay->n_units, sizeof(model_unit));
    *products = calloc((size_t)lay->n_units, sizeof **products);
    SHLM_CHECK_ALLOC(adapters->units);
    SHLM_CHECK_ALLOC(*products);
    adapters->total_numel = 0;
    const int64_t r = lc->rank;
    for (int u = 0; u < lay->n_units; u++) {
        const model_unit *bu = &lay->units[u];
        model_unit *au = &adapters->units[u];
        au->grad_writes = 1;
        for (int k = 0; k < bu->n_fp8; k++) {
            const model_fp8_weight *w = &bu->fp8[k];
            const size_t lo = w->offset, hi = lo + (size_t)w->rows * w->cols;
            lora_product *p = &(*products)[u][k];
            for (int i = 0; i < bu->n_tensors; i++) {
                const model_tensor *t = &bu->tensors[i];
                if (t->target < 0 || !(lc->targets & 1u << t->target) || t->offset < lo ||
                    t->offset >= hi)
                    continue;
                if (p->n_sites == LORA_MAX_SITES)
                    SHLM_FATAL("adapters: more than %d projections in one product", LORA_MAX_SITES);
                p->sites[p->n_sites++] = (lora_site){.target = t->target, .tensor = i,
                                                     .row0 = (int)((t->offset - lo) / (size_t)w->cols),
                                                     .rows = (int)t->shape[0], .m = -1};
            }
            char proj[96];
            /* A's first (one matrix for the whole product), then B's, then magnitudes */
            for (int j = 0; j < p->n_sites; j++) {
                const model_tensor *t = &bu->tensors[p->sites[j].tensor];
                projection_name(t, proj, sizeof proj);
                p->sites[j].a = au->n_tensors;
                add(au, proj, "lora_A.weight", r, t->shape[1], 1, t->target);
            }
            for (int j = 0; j < p->n_sites; j++) {
                const model_tensor *t = &bu->tensors[p->sites[j].tensor];
                projection_name(t, proj, sizeof proj);
                p->sites[j].b = au->n_tensors;
                add(au, proj, "lora_B.weight", t->shape[0], r, 1, t->target);
            }
            for (int j = 0; lc->dora && j < p->n_sites; j++) {
                const model_tensor *t = &bu->tensors[p->sites[j].tensor];
                projection_name(t, proj, sizeof proj);
                p->sites[j].m = au->n_tensors;
                add(au, proj, "lora_magnitude_vector", t->shape[0], 0, 0, t->target);
            }
        }
        adapters->total_numel += au->numel;
    }
}

void adapters_open(model_desc *m, const lora_config *lc) {
    if (lc->rank <= 0) return;
    m->lora = *lc;
    adapters_layout(&m->lay, lc, &m->adapters, &m->lora_products);
}

float lora_scale(const lora_config *lc) {
    return lc->rslora ? (float)(lc->alpha / sqrt((double)lc->rank)) : lc->alpha / (float)lc->rank;
}

void adapters_init_slice(const model_layout *adapters, uint64_t seed, int u, size_t begin,
                         size_t end, float *out) {
    const model_unit *unit = &adapters->units[u];
    /* a stream per unit of its own, apart from the base's (decoder.c's init) */
    const uint64_t key = rng_hash64(seed ^ rng_hash64(0x10a4a000ull + (uint64_t)u));
    for (size_t i = begin; i < end; i++) out[i - begin] = 0.0f;
    for (int k = 0; k < unit->n_tensors; k++) {
        const model_tensor *t = &unit->tensors[k];
        const size_t lo = t->offset > begin ? t->offset : begin;
        const size_t hi = t->offset + t->numel < end ? t->offset + t->numel : end;
        const size_t n = strlen(t->name);
        if (n > 14 && strcmp(t->name + n - 14, ".lora_A.weight") == 0) {
            /* kaiming_uniform_(a=√5): gain √(2/6), bound gain·√(3/in) = 1/√in */
            const double bound = 1.0 / sqrt((double)t->shape[1]);
            for (size_t i = lo; i < hi; i++)
                out[i - begin] = (float)(bound * (2.0 * rng_uniform_at(key, i) - 1.0));
        } else if (t->ndim == 1) {
            for (size_t i = lo; i < hi; i++) out[i - begin] = 1.0f;
        }
    }
}

int adapters_base_tensor(const model_unit *base, const model_tensor *t) {
    const char *dot = strstr(t->name, ".lora_");
    if (!dot) return -1;
    const size_t k = (size_t)(dot - t->name);
    for (int i = 0; i < base->n_tensors; i++)
        if (strncmp(base->tensors[i].name, t->name, k) == 0 &&
            strcmp(base->tensors[i].name + k, ".weight") == 0)
            return i;
    return -1;
}

int adapters_module_name(const model_layout *lay, int target, char *out, size_t outlen) {
    for (int u = 0; u < lay->n_units; u++)
        for (int i = 0; i < lay->units[u].n_tensors; i++) {
            const model_tensor *t = &lay->units[u].tensors[i];
            if (t->target != target) continue;
            char proj[96];
            projection_name(t, proj, sizeof proj);
            const char *dot = strrchr(proj, '.');
            snprintf(out, outlen, "%s", dot ? dot + 1 : proj);
            return 0;
        }
    return -1;
}
