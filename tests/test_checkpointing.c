/* Activation checkpointing: FULL and SELECTIVE recomputation give the same loss and
 * gradients as keeping everything, in less activation memory, as the plan predicts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "src/model/decoder.h"
#include "src/base/rng.h"
#include "tests/check.h"
#include "tests/resident_source.h"


int main(void) {
    printf("# reproduce: tests/test_checkpointing\n");
    decoder_config c = {.dim = 32, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8,
                      .ffn_dim = 40, .vocab_size = 29, .max_seq_len = 16, .norm_eps = 1e-5f,
                      .rope_theta = 10000.0f, .init_std = 0.2f};
    const int B = 3, T = 9, N = B * T;
    resident r;
    decoder_layout(&c, &r.lay);
    r.params = calloc(r.lay.n_units, sizeof(float *));
    r.grads = calloc(r.lay.n_units, sizeof(float *));
    for (int u = 0; u < r.lay.n_units; u++) {
        r.params[u] = malloc(r.lay.units[u].numel * sizeof(float));
        r.grads[u] = malloc(r.lay.units[u].numel * sizeof(float));
        decoder_spec.init_slice(&r.lay, &c, 11, u, 0, r.lay.units[u].numel, r.params[u]);
    }
    int32_t x[27], y[27];
    for (int i = 0; i < N; i++) {
        x[i] = (int32_t)(rng_hash64(i + 5) % c.vocab_size);
        y[i] = (int32_t)(rng_hash64(i + 500) % c.vocab_size);
    }
    model_param_source src = resident_source(&r);
    const model_ac modes[3] = {MODEL_AC_NONE, MODEL_AC_SELECTIVE, MODEL_AC_FULL};
    const char *names[3] = {"none", "selective", "full"};
    float loss[3];
    size_t bytes[3];
    float **ref = calloc(r.lay.n_units, sizeof(float *));
    for (int k = 0; k < 3; k++) {
        for (int u = 0; u < r.lay.n_units; u++)
            memset(r.grads[u], 0, r.lay.units[u].numel * sizeof(float));
        decoder *m = decoder_create(&c, &shlm_ops_cpu, B, T, &(model_opts){.ac = modes[k]}, src);
        bytes[k] = decoder_activation_bytes(m);
        size_t planned = decoder_spec.activation_bytes(&c, SHLM_F32, B, T, modes[k], MODEL_MATMUL_BF16, 1);
        /* two steps through the same model: the second reuses recomputed scratch */
        decoder_forward_backward(m, &(model_batch){x, y, NULL, B, T}, 1.0f, NULL);
        loss[k] = (float)decoder_forward_backward(m, &(model_batch){x, y, NULL, B, T}, 1.0f, NULL);
        decoder_destroy(m);
        double worst = 0;
        for (int u = 0; u < r.lay.n_units; u++) {
            size_t n = r.lay.units[u].numel;
            if (k == 0) {
                ref[u] = malloc(n * sizeof(float));
                memcpy(ref[u], r.grads[u], n * sizeof(float));
            }
            for (size_t i = 0; i < n; i++)
                worst = fmax(worst, fabs(r.grads[u][i] - ref[u][i]) / (fabs(ref[u][i]) + 1e-6));
        }
        int ok = fabsf(loss[k] - loss[0]) <= 1e-6f * fabsf(loss[0]) && worst <= 1e-6 &&
                 planned == bytes[k];
        check(ok, "ac=%-9s loss %.8f grads max rel diff %.2e activations %zu bytes (plan %zu)",
              names[k], loss[k], worst, bytes[k], planned);
    }
    check(bytes[2] < bytes[1] && bytes[1] < bytes[0],
          "activation bytes: full %zu < selective %zu < none %zu", bytes[2], bytes[1], bytes[0]);
    return check_exit();
}
