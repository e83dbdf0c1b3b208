/* The decoder's KV-cache generator (src/model/decoder_decode.c) against its own forward on
 * the cpu backend: after a prefill of prompts of different lengths (rows not contiguous,
 * prompts longer than a pass's part so they go in parts), after each decode step (all rows,
 * then a subset, then a row started over beside rows that go on), every row's next-token
 * logits equal decoder_forward's last-position logits of the row's whole sequence within
 * 1e-5 of the row's largest |logit|: the same ops on the same values, but OpenBLAS sums a
 * product's row in an order that depends on the product's size (its small-matrix kernels,
 * its one-row path), and a row here is in a product of another size than the forward's,
 * so the bits may differ (those that do not are said). Shapes: GQA with an
 * untied head; tied embeddings with q/k/v biases drawn away from 0 and norm weights away
 * from 1; MHA with one layer. The bytes it allocates are model_spec.generator_bytes'.
 *   tests/test_decode */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "src/base/rng.h"
#include "src/model/decoder.h"
#include "tests/check.h"
#include "tests/resident_source.h"

enum { ROWS = 4, CAP = 100, STEPS = 5 };

/* A model's weights: the seed's initialisation, with every 1-D tensor (norms, biases)
 * moved away from its initial value so that a missing bias or norm shows. */
static void fill_weights(resident *r, const decoder_config *c) {
    r->params = calloc((size_t)r->lay.n_units, sizeof(float *));
    r->grads = calloc((size_t)r->lay.n_units, sizeof(float *));
    for (int u = 0; u < r->lay.n_units; u++) {
        const model_unit *unit = &r->lay.units[u];
        r->params[u] = malloc(unit->numel * sizeof(float));
        r->grads[u] = calloc(unit->numel, sizeof(float));
        decoder_spec.init_slice(&r->lay, c, 7, u, 0, unit->numel, r->params[u]);
        for (int k = 0; k < unit->n_tensors; k++) {
            const model_tensor *t = &unit->tensors[k];
            if (t->ndim != 1) continue;
            for (size_t i = 0; i < t->numel; i++)
                r->params[u][t->offset + i] += (float)(0.3 * rng_normal_at(u * 31 + k, i));
        }
    }
}

static void free_weights(resident *r) {
    for (int u = 0; u < r->lay.n_units; u++) {
        free(r->params[u]);
        free(r->grads[u]);
    }
    free(r->params);
    free(r->grads);
    model_layout_free(&r->lay);
}

/* The sequences: row r's tokens, its length so far. */
typedef struct seqs {
    int32_t tok[ROWS][CAP];
    int len[ROWS];
} seqs;

static int32_t token(int r, int i, int V, int salt) {
    return (int32_t)(rng_hash64((uint64_t)salt * 1000003u + (uint64_t)r * 997u + (uint64_t)i) % (uint64_t)V);
}

/* Row rows[i]'s logits got[i·V ..] against the forward of its whole sequence. */
static void compare(decoder *fwd, const seqs *s, int n, const int *rows, const float *got,
                    int V, const char *shape, const char *when) {
    float *want = malloc((size_t)V * sizeof(float));
    for (int i = 0; i < n; i++) {
        const int r = rows[i], T = s->len[r];
        decoder_forward(fwd, &(model_batch){s->tok[r], NULL, NULL, 1, T}, NULL, NULL, want);
        double worst = 0, scale = 0;
        int same = 1;
        for (int v = 0; v < V; v++) {
            const float a = got[(size_t)i * V + v], b = want[v];
            worst = fmax(worst, fabs((double)a - b));
            scale = fmax(scale, fabs((double)b));
            same &= memcmp(&a, &b, sizeof a) == 0;
        }
        check(worst <= 1e-5 * scale && isfinite(worst),
              "%s: %s: row %d (%d tokens): max |diff| %.2e of max |logit| %.3f%s", shape, when,
              r, T, worst, scale, same ? " (the same bits)" : "");
    }
    free(want);
}

static void run_shape(const char *shape, decoder_config c) {
    resident r;
    decoder_layout(&c, &r.lay);
    fill_weights(&r, &c);
    const model_param_source src = resident_source(&r);
    const model_opts mo = {.ac = MODEL_AC_FULL};
    decoder *fwd = decoder_create(&c, &shlm_ops_cpu, 1, CAP, &mo, src);
    decoder *m = decoder_create(&c, &shlm_ops_cpu, 1, 8, &mo, src);
    const size_t before = shlm_ops_cpu.allocated_bytes();
    decoder_gen *g = decoder_gen_create(m, ROWS, CAP);
    const size_t got_bytes = shlm_ops_cpu.allocated_bytes() - before;
    const size_t planned = decoder_generator_bytes(&c, SHLM_F32, ROWS, CAP, 1);
    check(got_bytes == planned && decoder_gen_bytes(g) == planned,
          "%s: the generator allocated %zu bytes, generator_bytes says %zu", shape, got_bytes,
          planned);
    const int V = c.vocab_size;
    float *logits = malloc((size_t)ROWS * V * sizeof(float));
    seqs s;
    /* prompts of 70, 1 and 90 tokens in rows 0, 2, 3: a pass holds 4·64 tokens, so the
     * three go 64 a row at a time, the longest in two parts */
    const int rows3[] = {0, 2, 3}, lens3[] = {70, 1, 90};
    const int32_t *prompts[3];
    for (int i = 0; i < 3; i++) {
        const int row = rows3[i];
        for (int k = 0; k < lens3[i]; k++) s.tok[row][k] = token(row, k, V, 1);
        s.len[row] = lens3[i];
        prompts[i] = s.tok[row];
    }
    decoder_gen_prefill(g, 3, rows3, prompts, lens3, logits);
    compare(fwd, &s, 3, rows3, logits, V, shape, "prefill of rows 0, 2, 3");
    for (int step = 0; step < STEPS; step++) {
        int32_t next[3];
        for (int i = 0; i < 3; i++) {
            next[i] = token(rows3[i], s.len[rows3[i]], V, 2);
            s.tok[rows3[i]][s.len[rows3[i]]++] = next[i];
        }
        decoder_gen_decode(g, 3, rows3, next, logits);
        char when[64];
        snprintf(when, sizeof when, "decode step %d of rows 0, 2, 3", step + 1);
        compare(fwd, &s, 3, rows3, logits, V, shape, when);
    }
    /* one row alone, then row 2 started over with a new prompt and row 1 (never used)
     * prefilled beside it, then a step of all four */
    const int one[] = {3};
    int32_t t3 = token(3, s.len[3], V, 3);
    s.tok[3][s.len[3]++] = t3;
    decoder_gen_decode(g, 1, one, &t3, logits);
    compare(fwd, &s, 1, one, logits, V, shape, "decode of row 3 alone");
    const int rows2[] = {1, 2}, lens2[] = {9, 66};
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < lens2[i]; k++) s.tok[rows2[i]][k] = token(rows2[i], k, V, 4);
        s.len[rows2[i]] = lens2[i];
        prompts[i] = s.tok[rows2[i]];
    }
    decoder_gen_prefill(g, 2, rows2, prompts, lens2, logits);
    compare(fwd, &s, 2, rows2, logits, V, shape, "rows 1, 2 started over");
    const int all[] = {0, 1, 2, 3};
    int32_t t4[4];
    for (int i = 0; i < 4; i++) {
        t4[i] = token(i, s.len[i], V, 5);
        s.tok[i][s.len[i]++] = t4[i];
    }
    decoder_gen_decode(g, 4, all, t4, logits);
    compare(fwd, &s, 4, all, logits, V, shape, "decode of all four rows");
    free(logits);
    decoder_gen_destroy(g);
    decoder_destroy(m);
    decoder_destroy(fwd);
    free_weights(&r);
}

int main(void) {
    printf("# reproduce: tests/test_decode\n");
    run_shape("GQA 4/2, untied",
              (decoder_config){.dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                               .head_dim = 8, .ffn_dim = 44, .vocab_size = 67,
                               .max_seq_len = CAP, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                               .init_std = 0.2f});
    run_shape("tied, q/k/v biases",
              (decoder_config){.dim = 48, .n_layers = 2, .n_heads = 6, .n_kv_heads = 2,
                               .head_dim = 8, .ffn_dim = 40, .vocab_size = 101,
                               .max_seq_len = CAP, .norm_eps = 1e-6f, .rope_theta = 1e6f,
                               .init_std = 0.2f, .tie_word_embeddings = 1, .qkv_bias = 1});
    run_shape("MHA, one layer",
              (decoder_config){.dim = 24, .n_layers = 1, .n_heads = 3, .n_kv_heads = 3,
                               .head_dim = 8, .ffn_dim = 36, .vocab_size = 50,
                               .max_seq_len = CAP, .norm_eps = 1e-5f, .rope_theta = 500.0f,
                               .init_std = 0.2f});
    printf("# %d checks, %d failed: %s\n", n_checks, n_failed, n_failed ? "FAIL" : "PASS");
    return n_failed ? 1 : 0;
}
