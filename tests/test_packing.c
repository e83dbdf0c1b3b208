/* Packed documents through the whole model (src/model/decoder.c with doc_start, the cpu backend):
 * a window of several documents with document masks gives the losses and gradients of the
 * documents run one by one from position 0 (RoPE is relative, so only rounding differs),
 * an all-zero doc_start gives the causal results bit for bit, and a batch without a
 * trained target gives a zero gradient and no NaN. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "src/model/decoder.h"
#include "src/base/rng.h"
#include "tests/check.h"
#include "tests/resident_source.h"

enum { B = 2, T = 24 };

static void zero_grads(resident *r) {
    for (int u = 0; u < r->lay.n_units; u++)
        memset(r->grads[u], 0, r->lay.units[u].numel * sizeof(float));
}

static float **copy_grads(const resident *r) {
    float **g = calloc((size_t)r->lay.n_units, sizeof *g);
    for (int u = 0; u < r->lay.n_units; u++) {
        size_t n = r->lay.units[u].numel;
        g[u] = malloc(n * sizeof(float));
        memcpy(g[u], r->grads[u], n * sizeof(float));
    }
    return g;
}

/* max |a - b| / max |b| over every gradient element */
static double grad_diff(const resident *r, float **a, float **b) {
    double d = 0, mx = 0;
    for (int u = 0; u < r->lay.n_units; u++)
        for (size_t i = 0; i < r->lay.units[u].numel; i++) {
            d = fmax(d, fabs((double)a[u][i] - b[u][i]));
            mx = fmax(mx, fabs((double)b[u][i]));
        }
    return mx > 0 ? d / mx : d;
}

int main(void) {
    printf("# reproduce: tests/test_packing\n");
    decoder_config c = {.dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8,
                      .ffn_dim = 40, .vocab_size = 61, .max_seq_len = T, .norm_eps = 1e-5f,
                      .rope_theta = 10000.0f, .init_std = 0.2f};
    resident r;
    decoder_layout(&c, &r.lay);
    r.params = calloc((size_t)r.lay.n_units, sizeof(float *));
    r.grads = calloc((size_t)r.lay.n_units, sizeof(float *));
    for (int u = 0; u < r.lay.n_units; u++) {
        size_t n = r.lay.units[u].numel;
        r.params[u] = malloc(n * sizeof(float));
        r.grads[u] = calloc(n, sizeof(float));
        decoder_spec.init_slice(&r.lay, &c, 11, u, 0, n, r.params[u]);
    }
    decoder *m = decoder_create(&c, &shlm_ops_cpu, B, T, &(model_opts){0}, resident_source(&r));

    /* row 0: documents at 0, 7, 15; row 1: a document begun before the window, then
     * documents at 5, 12, 20. Targets as the loader makes them with doc_mask: -1 where the
     * next token starts a document, and on a few masked (prompt) positions */
    const int starts[B][4] = {{0, 7, 15, -1}, {0, 5, 12, 20}};
    int32_t x[B * T], y[B * T], ds[B * T];
    for (int b = 0; b < B; b++) {
        int k = 0;
        for (int t = 0; t < T; t++) {
            if (k + 1 < 4 && starts[b][k + 1] == t) k++;
            ds[b * T + t] = starts[b][k];
            x[b * T + t] = (int32_t)(rng_hash64(b * T + t) % c.vocab_size);
        }
        for (int t = 0; t < T; t++) {
            const int next_starts = t + 1 < T && ds[b * T + t + 1] == t + 1;
            const int masked = (t * 7 + b) % 5 == 0;
            y[b * T + t] = next_starts || masked ? -1 : (int32_t)(rng_hash64(999 + b * T + t) % c.vocab_size);
        }
    }

    /* packed: one pass over both rows with their document starts */
    zero_grads(&r);
    int v_packed = 0;
    const double sum_fb = decoder_forward_backward(m, &(model_batch){x, y, ds, B, T}, 1.0f, &v_packed);
    float **g_packed = copy_grads(&r);
    int v_fwd = 0;
    const double sum_fwd = decoder_forward(m, &(model_batch){x, y, ds, B, T}, &v_fwd, NULL, NULL);

    /* one by one: each document alone from position 0 */
    zero_grads(&r);
    double sum_sep = 0;
    int v_sep = 0;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < 4 && starts[b][k] >= 0; k++) {
            const int a = starts[b][k], e = k + 1 < 4 && starts[b][k + 1] >= 0 ? starts[b][k + 1] : T;
            int v = 0;
            sum_sep += decoder_forward_backward(m, &(model_batch){x + b * T + a, y + b * T + a, NULL, 1, e - a}, 1.0f, &v);
            v_sep += v;
        }
    const double dl = fabs(sum_fb - sum_sep) / fabs(sum_sep), dg = grad_diff(&r, g_packed, r.grads);
    check(v_packed == v_sep && v_fwd == v_sep && dl < 1e-5 && fabs(sum_fwd - sum_fb) <= 1e-6 * fabs(sum_fb),
          "packed with doc_start = documents alone: loss sums %.9g / %.9g (rel %.2e, forward "
          "only %.9g), %d / %d targets", sum_fb, sum_sep, dl, sum_fwd, v_packed, v_sep);
    check(dg < 1e-4, "packed with doc_start = documents alone: gradients (max rel %.2e)", dg);

    /* without the masks the documents see each other: the loss must differ */
    const double sum_causal = decoder_forward(m, &(model_batch){x, y, NULL, B, T}, NULL, NULL, NULL);
    check(fabs(sum_causal - sum_sep) > 1e-3 * fabs(sum_sep),
          "the causal pass over the same window differs (%.9g vs %.9g): the masks matter",
          sum_causal, sum_sep);
    /* doc_start all zero is the causal mask, bit for bit */
    int32_t zeros[B * T] = {0};
    const double sum_zero = decoder_forward(m, &(model_batch){x, y, zeros, B, T}, NULL, NULL, NULL);
    check(sum_zero == sum_causal, "doc_start all zero = NULL bit for bit (%.17g, %.17g)",
          sum_zero, sum_causal);

    /* nothing trained: zero gradient, zero loss, no NaN */
    int32_t none[B * T];
    for (int i = 0; i < B * T; i++) none[i] = -1;
    zero_grads(&r);
    int v0 = -1;
    const double sum0 = decoder_forward_backward(m, &(model_batch){x, none, ds, B, T}, 1.0f, &v0);
    int all_zero = 1;
    for (int u = 0; u < r.lay.n_units; u++)
        for (size_t i = 0; i < r.lay.units[u].numel; i++) all_zero &= r.grads[u][i] == 0.0f;
    check(v0 == 0 && sum0 == 0.0 && all_zero,
          "no trained target: 0 targets (%d), loss sum %g, every gradient exactly 0", v0, sum0);

    decoder_destroy(m);
    for (int u = 0; u < r.lay.n_units; u++) {
        free(r.params[u]);
        free(r.grads[u]);
        free(g_packed[u]);
    }
    free(r.params);
    free(r.grads);
    free(g_packed);
    model_layout_free(&r.lay);
    return check_exit();
}
