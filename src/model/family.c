/* What every family shares behind family.h: shape helpers over the family's table, the
 * FP8 capability rule, the model object. */
#include "src/model/family.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "src/model/fp8_linear.h"

int model_shape_vocab_size(const model_shape *s) {
    return s->family->vocab_size(model_shape_cdata(s));
}

int model_shape_max_seq_len(const model_shape *s) {
    return s->family->max_seq_len(model_shape_cdata(s));
}

int64_t model_shape_param_count(const model_shape *s) {
    return s->family->param_count(model_shape_cdata(s));
}

double model_shape_flops_per_token(const model_shape *s, int T) {
    return s->family->flops_per_token(model_shape_cdata(s), T);
}

int model_shape_validate(const model_shape *s, char *err, size_t errlen) {
    int blame[2];
    return s->family->validate(model_shape_cdata(s), err, errlen, blame);
}

int model_shape_diff(const model_shape *a, const model_shape *b, unsigned flags) {
    if (a->family != b->family) return -2;
    const model_family *f = a->family;
    for (int i = 0; i < f->n_keys; i++)
        if ((!flags || (f->keys[i].flags & flags)) && !key_equal(&f->keys[i], model_shape_cdata(a), model_shape_cdata(b))) return i;
    return -1;
}

void model_shape_desc_open(model_desc *d, const model_shape *s) {
    model_desc_open(d, s->family->spec, model_shape_cdata(s));
}

int model_check_opts(const model_opts *o, const shlm_ops *ops, char *why, size_t whylen) {
    if (o->matmul == MODEL_MATMUL_BF16) return 0;
    why[0] = '\0';
    if (!fp8_linear_ops_ok(ops))
        snprintf(why, whylen, "the %s backend of this build has no FP8 matmul", ops->name);
    else if (ops->fp8_check(why, whylen) != 0 && !why[0])
        snprintf(why, whylen, "the %s backend cannot run FP8 matmuls here", ops->name);
    return why[0] ? -1 : 0;
}

struct model {
    const model_family *family;
    model_shape shape;
    void *impl;
};

model *model_create(const model_shape *s, const shlm_ops *ops, int B, int T,
                    const model_opts *o, model_param_source src) {
    char why[512];
    if (model_check_opts(o, ops, why, sizeof why) != 0)
        SHLM_FATAL("model_create: %s (callers check model_check_opts first)", why);
    model *m = calloc(1, sizeof *m);
    SHLM_CHECK_ALLOC(m);
    m->family = s->family;
    m->shape = *s;
    m->impl = s->family->create(model_shape_cdata(s), ops, B, T, o, src);
    return m;
}

void model_destroy(model *m) {
    if (!m) return;
    m->family->destroy(m->impl);
    free(m);
}

const model_family *model_family_of(const model *m) { return m->family; }
const model_shape *model_shape_of(const model *m) { return &m->shape; }

double model_forward_backward(model *m, const model_batch *b, float grad_scale, int *n_valid) {
    return m->family->forward_backward(m->impl, b, grad_scale, n_valid);
}

double model_forward(model *m, const model_batch *b, int *n_valid, float *logits_out,
                     float *last_logits_out) {
    return m->family->forward(m->impl, b, n_valid, logits_out, last_logits_out);
}

size_t model_activation_bytes(const model *m) { return m->family->activation_bytes(m->impl); }

void model_set_profile(model *m, int on) { m->family->set_profile(m->impl, on); }

void model_take_profile(model *m, double *seconds) { m->family->take_profile(m->impl, seconds); }

struct model_gen {
    const model_family *family;
    void *impl;
    int rows, cap;
};

model_gen *model_gen_create(model *m, int rows, int cap) {
    if (!m->family->gen_create) return NULL;
    if (rows < 1 || cap < 1) SHLM_FATAL("model_gen_create: %d rows of %d tokens", rows, cap);
    model_gen *g = calloc(1, sizeof *g);
    SHLM_CHECK_ALLOC(g);
    g->family = m->family;
    g->impl = m->family->gen_create(m->impl, rows, cap);
    g->rows = rows;
    g->cap = cap;
    return g;
}

void model_gen_destroy(model_gen *g) {
    if (!g) return;
    g->family->gen_destroy(g->impl);
    free(g);
}

int model_gen_rows(const model_gen *g) { return g->rows; }
int model_gen_cap(const model_gen *g) { return g->cap; }

void model_gen_prefill(model_gen *g, int n, const int *rows, const int32_t *const *prompts,
                       const int *lens, float *logits) {
    g->family->gen_prefill(g->impl, n, rows, prompts, lens, logits);
}

void model_gen_decode(model_gen *g, int n, const int *rows, const int32_t *tokens,
                      float *logits) {
    g->family->gen_decode(g->impl, n, rows, tokens, logits);
}

size_t model_gen_bytes(const model_gen *g) { return g->family->gen_bytes(g->impl); }
