/* The FSDP engine, single-rank form: every unit's master weights, gradient and
 * AdamW moments live whole on this rank; gathered copies exist only when the
 * compute dtype differs from fp32 or bf16 parameters are emulated. */
#include "src/fsdp.h"

#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "kernels/check.h"

typedef struct unit_state {
    size_t numel;
    float *master, *grad, *m, *v; /* (numel) fp32, backend memory */
    void *gathered;               /* (numel) act dtype; NULL when master serves directly */
    int gathered_valid;           /* gathered matches master */
} unit_state;

struct fsdp_engine {
    llama_config mc;
    llama_layout lay;
    const shlm_ops *ops;
    fsdp_options opt;
    unit_state *units;
};

fsdp_engine *fsdp_create(const llama_config *mc, const shlm_ops *ops,
                         const fsdp_options *opt, uint64_t seed) {
    fsdp_engine *e = calloc(1, sizeof *e);
    SHLM_CHECK_ALLOC(e);
    e->mc = *mc;
    e->ops = ops;
    e->opt = *opt;
    llama_layout_init(&e->lay, mc);
    e->units = calloc((size_t)e->lay.n_units, sizeof(unit_state));
    SHLM_CHECK_ALLOC(e->units);
    const int needs_copy = ops->act_dtype != SHLM_F32 || opt->param_dtype != SHLM_F32;
    for (int u = 0; u < e->lay.n_units; u++) {
        unit_state *s = &e->units[u];
        s->numel = e->lay.units[u].numel;
        size_t bytes = s->numel * sizeof(float);
        s->master = ops->alloc(bytes);
        s->grad = ops->alloc(bytes);
        s->m = ops->alloc(bytes);
        s->v = ops->alloc(bytes);
        if (needs_copy) s->gathered = ops->alloc(s->numel * shlm_dtype_size(ops->act_dtype));
        float *host = malloc(bytes);
        SHLM_CHECK_ALLOC(host);
        llama_init_slice(&e->lay, mc, seed, u, 0, s->numel, host);
        ops->to_device(s->master, host, bytes);
        free(host);
    }
    return e;
}

void fsdp_destroy(fsdp_engine *e) {
    if (!e) return;
    for (int u = 0; u < e->lay.n_units; u++) {
        unit_state *s = &e->units[u];
        e->ops->free(s->master);
        e->ops->free(s->grad);
        e->ops->free(s->m);
        e->ops->free(s->v);
        e->ops->free(s->gathered);
    }
    free(e->units);
    llama_layout_free(&e->lay);
    free(e);
}

static const void *acquire(void *ctx, int u, llama_phase phase) {
    fsdp_engine *e = ctx;
    unit_state *s = &e->units[u];
    if (!s->gathered) return s->master;
    if (!s->gathered_valid) {
        if (e->ops->act_dtype == SHLM_F32) {
            /* fp32 compute with bf16 parameters: round a copy, keep the master exact */
            e->ops->copy(s->gathered, s->master, s->numel * sizeof(float));
            e->ops->round_to_bf16(s->gathered, s->numel);
        } else {
            e->ops->f32_to_act(s->gathered, s->master, s->numel);
        }
        s->gathered_valid = 1;
    }
    return s->gathered;
}

static void release(void *ctx, int u, llama_phase phase) {}

static float *grad(void *ctx, int u) { return ((fsdp_engine *)ctx)->units[u].grad; }

static void grad_ready(void *ctx, int u) {}

llama_param_source fsdp_param_source(fsdp_engine *e) {
    return (llama_param_source){
        .ctx = e, .acquire = acquire, .release = release, .grad = grad, .grad_ready = grad_ready};
}

void fsdp_zero_grad(fsdp_engine *e) {
    for (int u = 0; u < e->lay.n_units; u++)
        e->ops->zero(e->units[u].grad, e->units[u].numel * sizeof(float));
}

double fsdp_grad_norm(fsdp_engine *e) {
    double sq = 0;
    for (int u = 0; u < e->lay.n_units; u++)
        sq += e->ops->sum_squares(e->units[u].grad, e->units[u].numel);
    return sqrt(sq);
}

void fsdp_optimizer_step(fsdp_engine *e, float lr, float grad_scale, const adamw_hparams *h,
                         int step) {
    for (int u = 0; u < e->lay.n_units; u++) {
        unit_state *s = &e->units[u];
        const llama_unit *lu = &e->lay.units[u];
        for (int k = 0; k < lu->n_tensors; k++) {
            const llama_tensor *t = &lu->tensors[k];
            e->ops->adamw(s->master + t->offset, s->grad + t->offset, s->m + t->offset,
                          s->v + t->offset, t->numel, lr, h->beta1, h->beta2, h->eps,
                          t->weight_decay ? h->weight_decay : 0.0f, grad_scale, step);
        }
        s->gathered_valid = 0;
    }
}

size_t fsdp_state_bytes(const fsdp_engine *e) {
    size_t n = 0;
    for (int u = 0; u < e->lay.n_units; u++) n += 4 * e->units[u].numel * sizeof(float);
    return n;
}

void fsdp_get_unit(fsdp_engine *e, int u, float *out) {
    e->ops->to_host(out, e->units[u].master, e->units[u].numel * sizeof(float));
}

void fsdp_set_unit(fsdp_engine *e, int u, const float *in) {
    e->ops->to_device(e->units[u].master, in, e->units[u].numel * sizeof(float));
    e->units[u].gathered_valid = 0;
}
