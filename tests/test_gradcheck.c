/* Whole-model gradient check: the backward pass of a tiny decoder (GQA, odd sizes), with a
 * separate lm_head and with tied embeddings (one tensor for the lookup and the output
 * projection, its gradient the sum of both uses), and with q/k/v biases (added before
 * RoPE: their gradient is that of the pre-RoPE q, k, v), against central finite
 * differences of the loss, per coordinate and per direction. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "tests/decoder_test.h"
#include "src/base/rng.h"
#include "tests/check.h"
#include "tests/resident_source.h"


static float loss_of(decoder *m, const int32_t *x, const int32_t *y, int B, int T) {
    return decoder_forward_mean(m, &(model_batch){x, y, NULL, B, T}, NULL, NULL, NULL);
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
    float loss = (float)(decoder_forward_backward(m, &(model_batch){x, y, NULL, B, T}, 1.0f / (float)valid, NULL) /
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
    return check_exit();
}
