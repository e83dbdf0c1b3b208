/* Whole-model gradient check: the backward pass of a tiny decoder (GQA, odd sizes), with a
 * separate lm_head and with tied embeddings (one tensor for the lookup and the output
 * projection, its gradient the sum of both uses), and with q/k/v biases (added before
 * RoPE: their gradient is that of the pre-RoPE q, k, v), against central finite
 * differences of the loss, per coordinate and per direction; and LoRA's adapters (all seven
 * projections, rsLoRA on some, DoRA's magnitudes) over a frozen base. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "tests/decoder_test.h"
#include "src/base/rng.h"
#include "tests/check.h"
#include "tests/resident_source.h"
#include "src/engine/adapters.h"


static const void *lora_acquire(void *ctx, int u, model_phase ph);

static float loss_of(decoder *m, const int32_t *x, const int32_t *y, int B, int T) {
    return decoder_forward_mean(m, &(model_batch){x, y, NULL, B, T, NULL}, NULL, NULL, NULL);
}

/* Checks the model of shape c (tests/check.h counts). */
static void gradcheck(const decoder_config *cfg) {
    const decoder_config c = *cfg;
    printf("# %s embeddings%s\n", c.tie_word_embeddings ? "tied" : "untied",
           c.qkv_bias ? ", q/k/v biases" : "");
    const int B = 2, T = 7, N = B * T;
    resident r;
    decoder_layout(&c, &r.lay);
    r.params = calloc(r.lay.n_units, sizeof(float *));
    r.grads = calloc(r.lay.n_units, sizeof(float *));
    for (int u = 0; u < r.lay.n_units; u++) {
        size_t n = r.lay.units[u].numel;
        r.params[u] = malloc(n * sizeof(float));
        r.grads[u] = calloc(n, sizeof(float));
        decoder_spec.init_slice(&r.lay, &c, 7, u, 0, n, r.params[u]);
        /* norm weights away from 1 and biases away from 0 so their gradients are exercised
         * in general position (the matrices' normal draws are neither) */
        for (size_t i = 0; i < n; i++)
            if (r.params[u][i] == 1.0f || r.params[u][i] == 0.0f)
                r.params[u][i] += 0.3f * (float)rng_normal_at(99, i + 1000 * u);
    }
    model_param_source src = resident_source(&r);
    decoder *m = decoder_create(&c, &shlm_ops_cpu, B, T, &(model_opts){0}, src);
    int32_t x[14], y[14];
    for (int i = 0; i < N; i++) {
        x[i] = (int32_t)(rng_hash64(i) % c.vocab_size);
        y[i] = i % 5 == 3 ? -1 : (int32_t)(rng_hash64(i + 100) % c.vocab_size); /* some ignored */
    }
    int valid = 0;
    for (int i = 0; i < N; i++) valid += y[i] >= 0;
    /* the mean loss's gradient: each target's loss gradient is 1 / (targets) */
    float loss = (float)(decoder_forward_backward(m, &(model_batch){x, y, NULL, B, T, NULL}, 1.0f / (float)valid, NULL) /
                         valid);
    float loss2 = loss_of(m, x, y, B, T);
    check(!(fabsf(loss - loss2) > 1e-6f * fabsf(loss)),
          "forward_backward and forward agree on the loss: fwd+bwd %.7f, fwd only %.7f", loss,
          loss2);

    /* per coordinate: a few entries of every tensor */
    const float eps = 1e-2f;
    double worst = 0;
    for (int u = 0; u < r.lay.n_units; u++) {
        const model_unit *lu = &r.lay.units[u];
        for (int k = 0; k < lu->n_tensors; k++) {
            const model_tensor *t = &lu->tensors[k];
            double tensor_worst = 0, gmax = 0;
            for (size_t i = 0; i < t->numel; i++)
                gmax = fmax(gmax, fabs(r.grads[u][t->offset + i]));
            for (int s = 0; s < 6; s++) {
                size_t i = t->offset + rng_hash64(s * 7919 + k * 31 + u * 1000003) % t->numel;
                float keep = r.params[u][i];
                r.params[u][i] = keep + eps;
                double lp = loss_of(m, x, y, B, T);
                r.params[u][i] = keep - eps;
                double lm = loss_of(m, x, y, B, T);
                r.params[u][i] = keep;
                double fd = (lp - lm) / (2 * eps), an = r.grads[u][i];
                double err = fabs(fd - an) / fmax(gmax, 1e-3);
                tensor_worst = fmax(tensor_worst, err);
            }
            worst = fmax(worst, tensor_worst);
            check(tensor_worst < 2e-3, "%-45s max |fd-analytic|/max|g| = %.2e (max|g| %.2e)",
                  t->name, tensor_worst, gmax);
        }
    }

    /* one random direction over all parameters at once */
    double dot = 0, vnorm = 0;
    const size_t n_units = r.lay.n_units > 0 ? (size_t)r.lay.n_units : 1;
    float **dir = calloc(n_units, sizeof(float *));
    for (int u = 0; u < r.lay.n_units; u++) {
        size_t n = r.lay.units[u].numel;
        dir[u] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            dir[u][i] = (float)rng_normal_at(4242 + u, i);
            dot += (double)dir[u][i] * r.grads[u][i];
            vnorm += (double)dir[u][i] * dir[u][i];
        }
    }
    const float h = 1e-3f / (float)sqrt(vnorm / 1000);
    double l[2];
    for (int side = 0; side < 2; side++) {
        for (int u = 0; u < r.lay.n_units; u++)
            for (size_t i = 0; i < r.lay.units[u].numel; i++)
                r.params[u][i] += (side == 0 ? h : -2 * h) * dir[u][i];
        l[side] = loss_of(m, x, y, B, T);
    }
    double fd = (l[0] - l[1]) / (2 * h);
    double rel = fabs(fd - dot) / fabs(dot);
    check(rel < 2e-3, "directional derivative: finite difference %.6f, analytic %.6f, rel err %.2e",
          fd, dot, rel);
    decoder_destroy(m);
    for (int u = 0; u < r.lay.n_units; u++) free(r.params[u]), free(r.grads[u]), free(dir[u]);
    free(r.params);
    free(r.grads);
    free(dir);
    model_layout_free(&r.lay);
    printf("# %s%s: worst coordinate error %.2e\n", c.tie_word_embeddings ? "tied" : "untied",
           c.qkv_bias ? ", q/k/v biases" : "", worst);
}

/* LoRA (src/model/lora_linear.h): the base resident and frozen, the adapters (A, B and
 * DoRA's magnitudes at random non-zero values) trained: the source hands out their
 * gradients (grad()), the base's are never asked for. */
typedef struct lora_resident {
    resident base;
    model_layout alay;
    float **aparams, **agrads;
} lora_resident;

static const void *lora_adapter(void *ctx, int u) { return ((lora_resident *)ctx)->aparams[u]; }
static const void *lora_acquire(void *ctx, int u, model_phase ph) {
    return resident_acquire(&((lora_resident *)ctx)->base, u, ph);
}
static float *lora_grad(void *ctx, int u, int *overwrite) {
    *overwrite = 0;
    return ((lora_resident *)ctx)->agrads[u];
}

/* The adapters' gradients of the model of shape cfg with lc's adapters against central
 * finite differences of the loss, a few coordinates of every adapter tensor. DoRA's A and B
 * are left out: their gradient, as PEFT's, treats the weight norm as a constant (detached),
 * so it is not the loss's derivative; its magnitudes' is. */
static void lora_gradcheck(const decoder_config *cfg, const lora_config *lc) {
    const decoder_config c = *cfg;
    printf("# LoRA rank %d%s%s\n", lc->rank, lc->rslora ? ", rsLoRA" : "", lc->dora ? ", DoRA" : "");
    const int B = 2, T = 7, N = B * T;
    lora_resident r;
    decoder_layout(&c, &r.base.lay);
    lora_product (*products)[MODEL_MAX_FP8_WEIGHTS];
    adapters_layout(&r.base.lay, lc, &r.alay, &products);
    free(products);
    const int U = r.base.lay.n_units;
    r.base.params = calloc((size_t)U, sizeof(float *));
    r.base.grads = calloc((size_t)U, sizeof(float *));
    r.aparams = calloc((size_t)U, sizeof(float *));
    r.agrads = calloc((size_t)U, sizeof(float *));
    for (int u = 0; u < U; u++) {
        const size_t n = r.base.lay.units[u].numel, an = r.alay.units[u].numel;
        r.base.params[u] = malloc(n * sizeof(float));
        decoder_spec.init_slice(&r.base.lay, &c, 7, u, 0, n, r.base.params[u]);
        r.aparams[u] = malloc((an ? an : 1) * sizeof(float));
        r.agrads[u] = calloc(an ? an : 1, sizeof(float));
        for (size_t i = 0; i < an; i++) /* A, B: ~0.3; magnitudes: near 1 (rows of norm ~1) */
            r.aparams[u][i] = 0.3f * (float)rng_normal_at(31 + u, i);
        for (int k = 0; k < r.alay.units[u].n_tensors; k++) {
            const model_tensor *t = &r.alay.units[u].tensors[k];
            if (t->ndim == 1)
                for (size_t i = 0; i < t->numel; i++) r.aparams[u][t->offset + i] += 1.0f;
        }
    }
    model_param_source src = resident_source(&r.base);
    src.ctx = &r;
    src.acquire = lora_acquire;
    src.adapter = lora_adapter;
    src.grad = lora_grad;
    decoder *m = decoder_create(&c, &shlm_ops_cpu, B, T, &(model_opts){.lora = *lc}, src);
    int32_t x[14], y[14];
    for (int i = 0; i < N; i++) {
        x[i] = (int32_t)(rng_hash64(i) % c.vocab_size);
        y[i] = i % 5 == 3 ? -1 : (int32_t)(rng_hash64(i + 100) % c.vocab_size);
    }
    int valid = 0;
    for (int i = 0; i < N; i++) valid += y[i] >= 0;
    decoder_forward_backward(m, &(model_batch){x, y, NULL, B, T, NULL}, 1.0f / (float)valid, NULL);
    const float eps = 1e-2f;
    int n_checked = 0;
    for (int u = 0; u < U; u++) {
        const model_unit *au = &r.alay.units[u];
        for (int k = 0; k < au->n_tensors; k++) {
            const model_tensor *t = &au->tensors[k];
            if (lc->dora && t->ndim == 2) continue;
            double tensor_worst = 0, gmax = 0;
            for (size_t i = 0; i < t->numel; i++)
                gmax = fmax(gmax, fabs(r.agrads[u][t->offset + i]));
            for (int s = 0; s < 4; s++) {
                size_t i = t->offset + rng_hash64(s * 7919 + k * 31 + u * 1000003) % t->numel;
                float keep = r.aparams[u][i];
                r.aparams[u][i] = keep + eps;
                double lp = loss_of(m, x, y, B, T);
                r.aparams[u][i] = keep - eps;
                double lm = loss_of(m, x, y, B, T);
                r.aparams[u][i] = keep;
                double fd = (lp - lm) / (2 * eps), an = r.agrads[u][i];
                tensor_worst = fmax(tensor_worst, fabs(fd - an) / fmax(gmax, 1e-3));
            }
            n_checked++;
            check(gmax > 0 && tensor_worst < 2e-3,
                  "%-55s max |fd-analytic|/max|g| = %.2e (max|g| %.2e)", t->name, tensor_worst, gmax);
        }
    }
    check(n_checked > 0, "LoRA rank %d: %d adapter tensors checked", lc->rank, n_checked);
    decoder_destroy(m);
    for (int u = 0; u < U; u++)
        free(r.base.params[u]), free(r.aparams[u]), free(r.agrads[u]);
    free(r.base.params);
    free(r.base.grads);
    free(r.aparams);
    free(r.agrads);
    model_layout_free(&r.alay);
    model_layout_free(&r.base.lay);
}

int main(void) {
    printf("# reproduce: tests/test_gradcheck\n");
    decoder_config c = {.dim = 24, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 6,
                      .ffn_dim = 19, .vocab_size = 23, .max_seq_len = 16, .norm_eps = 1e-5f,
                      .rope_theta = 10000.0f, .init_std = 0.3f};
    gradcheck(&c);
    c.tie_word_embeddings = 1;
    gradcheck(&c);
    c.qkv_bias = 1;
    gradcheck(&c);
    c.tie_word_embeddings = 0;
    gradcheck(&c);
    const unsigned all = (1u << MODEL_N_TARGETS) - 1;
    lora_gradcheck(&c, &(lora_config){.rank = 3, .alpha = 5, .targets = all});
    lora_gradcheck(&c, &(lora_config){.rank = 2, .alpha = 3, .rslora = 1,
                                      .targets = 1u << MODEL_TARGET_Q | 1u << MODEL_TARGET_V |
                                                 1u << MODEL_TARGET_DOWN});
    lora_gradcheck(&c, &(lora_config){.rank = 2, .alpha = 4, .dora = 1, .targets = all});
    return check_exit();
}
