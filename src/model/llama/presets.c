/* Llama-2 shape presets (the published configurations) and shape validation. */
#include <stdio.h>
#include <string.h>

#include "src/model/llama/llama.h"

typedef struct preset {
    const char *name;
    llama_config cfg;
} preset;

/* dim, layers, heads, kv heads, head_dim, ffn, vocab, max_seq, eps, theta, init_std, tied */
static const preset presets[] = {
    {"tiny", {128, 4, 4, 2, 32, 352, 256, 256, 1e-5f, 10000.0f, 0.02f, 0}},
    {"tinyllama-1b", {2048, 22, 32, 4, 64, 5632, 32000, 2048, 1e-5f, 10000.0f, 0.02f, 0}},
    {"llama2-7b", {4096, 32, 32, 32, 128, 11008, 32000, 4096, 1e-5f, 10000.0f, 0.02f, 0}},
    {"llama2-13b", {5120, 40, 40, 40, 128, 13824, 32000, 4096, 1e-5f, 10000.0f, 0.02f, 0}},
    {"llama2-70b", {8192, 80, 64, 8, 128, 28672, 32000, 4096, 1e-5f, 10000.0f, 0.02f, 0}},
};

int llama_preset(const char *name, llama_config *cfg) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) == 0) {
            *cfg = presets[i].cfg;
            return 0;
        }
    }
    return -1;
}

const char *llama_preset_names(void) {
    return "tiny tinyllama-1b llama2-7b llama2-13b llama2-70b";
}

int llama_config_validate(const llama_config *c, char *err, size_t errlen) {
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)
    if (c->dim <= 0) BAD("model.dim must be > 0 (got %d)", c->dim);
    if (c->n_layers <= 0) BAD("model.n_layers must be > 0 (got %d)", c->n_layers);
    if (c->n_heads <= 0) BAD("model.n_heads must be > 0 (got %d)", c->n_heads);
    if (c->n_kv_heads <= 0) BAD("model.n_kv_heads must be > 0 (got %d)", c->n_kv_heads);
    if (c->n_heads % c->n_kv_heads != 0)
        BAD("model.n_kv_heads (%d) must divide model.n_heads (%d)", c->n_kv_heads, c->n_heads);
    if (c->dim % c->n_heads != 0)
        BAD("model.dim (%d) must be divisible by model.n_heads (%d)", c->dim, c->n_heads);
    if (c->head_dim != c->dim / c->n_heads)
        BAD("head_dim (%d) must equal dim / n_heads (%d)", c->head_dim, c->dim / c->n_heads);
    if (c->head_dim % 2 != 0) BAD("head_dim (%d) must be even for RoPE", c->head_dim);
    if (c->ffn_dim <= 0) BAD("model.ffn_dim must be > 0 (got %d)", c->ffn_dim);
    if (c->vocab_size <= 1) BAD("model.vocab_size must be > 1 (got %d)", c->vocab_size);
    if (c->max_seq_len <= 0) BAD("model.max_seq_len must be > 0 (got %d)", c->max_seq_len);
    if (!(c->norm_eps > 0)) BAD("model.norm_eps must be > 0 (got %g)", c->norm_eps);
    if (!(c->rope_theta > 0)) BAD("model.rope_theta must be > 0 (got %g)", c->rope_theta);
    if (!(c->init_std > 0)) BAD("model.init_std must be > 0 (got %g)", c->init_std);
    if (c->tie_word_embeddings != 0 && c->tie_word_embeddings != 1)
        BAD("model.tie_word_embeddings must be 0 or 1 (got %d)", c->tie_word_embeddings);
    return 0;
#undef BAD
}

int64_t llama_param_count(const llama_config *c) {
    int64_t d = c->dim, hd = c->head_dim, F = c->ffn_dim, V = c->vocab_size;
    int64_t block = 2 * d + (c->n_heads + 2 * (int64_t)c->n_kv_heads) * hd * d +
                    d * c->n_heads * hd + 3 * F * d;
    return V * d + c->n_layers * block + d + (c->tie_word_embeddings ? 0 : V * d);
}
