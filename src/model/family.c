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
