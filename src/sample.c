/* Greedy and temperature/top-p sampling, and the generation loop (see sample.h). */
#include "src/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"

typedef struct prob_idx { float p; int i; } prob_idx;

static int by_prob_desc(const void *a, const void *b) {
    const prob_idx *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->i - y->i; /* ties by index: deterministic across libc qsort versions */
}

int sample_token(const float *logits, int V, float temperature, float top_p, rng_state *r) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    prob_idx *pi = malloc((size_t)V * sizeof *pi);
    SHLM_CHECK_ALLOC(pi);
    double sum = 0;
    for (int i = 0; i < V; i++) {
        pi[i].p = (float)exp((logits[i] - logits[best]) / temperature);
        pi[i].i = i;
        sum += pi[i].p;
    }
    qsort(pi, (size_t)V, sizeof *pi, by_prob_desc);
    double mass = 0, keep_mass = 0;
    int keep = 0;
    while (keep < V && (keep == 0 || mass < top_p)) {
        mass += pi[keep].p / sum;
        keep_mass += pi[keep].p;
        keep++;
    }
    double u = rng_uniform(r) * keep_mass, acc = 0;
    int choice = pi[keep - 1].i;
    for (int k = 0; k < keep; k++) {
        acc += pi[k].p;
        if (u < acc) {
            choice = pi[k].i;
            break;
        }
    }
    free(pi);
    return choice;
}

void sample_generate(llama_model *m, int max_ctx, const int32_t *prompt, int n_prompt,
                     int n_new, float temperature, float top_p, uint64_t seed, int32_t *out) {
    const int V = llama_get_layout(m)->units[LLAMA_UNIT_EMBED].tensors[0].shape[0];
    float *logits = malloc((size_t)V * sizeof(float));
    SHLM_CHECK_ALLOC(logits);
    rng_state r;
    rng_seed(&r, seed);
    memcpy(out, prompt, (size_t)n_prompt * sizeof(int32_t));
    int len = n_prompt;
    for (int k = 0; k < n_new; k++) {
        int ctx = len < max_ctx ? len : max_ctx;
        llama_forward(m, out + len - ctx, NULL, 1, ctx, NULL, NULL, logits);
        out[len++] = sample_token(logits, V, temperature, top_p, &r);
    }
    free(logits);
}
