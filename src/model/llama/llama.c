/* The Llama family (llama.h): Llama-2's and Llama-3.x's published shapes as presets (RoPE
 * scaling included: the decoder's rope_* keys), and the members of a LlamaForCausalLM
 * config.json that change the arithmetic and that shardlm does not implement, refused by
 * name rather than ignored. */
#include "src/model/llama/llama.h"

#include <stdio.h>
#include <string.h>

#include "io/errmsg.h"
#include "io/hf_model.h"
#include "src/model/decoder.h"

_Static_assert(sizeof(decoder_config) <= MODEL_SHAPE_BYTES, "a Llama shape fits model_shape");

static const key_def llama_keys[] = {DECODER_KEY_ROWS("10000", "false")};
_Static_assert(sizeof llama_keys / sizeof llama_keys[0] == DK_N, "one row per decoder key");

/* dim, layers, heads, kv heads, head_dim, ffn, vocab, max_seq, eps, theta, init_std, tied,
 * qkv_bias, rope type, factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings */
#define NO_SCALING SHLM_ROPE_DEFAULT, 0, 0, 0, 0
static const decoder_config tiny = {128, 4, 4, 2, 32, 352, 256, 256, 1e-5f, 10000.0f, 0.02f, 0, 0,
                                    NO_SCALING};
static const decoder_config tinyllama_1b = {2048, 22, 32, 4, 64, 5632, 32000, 2048, 1e-5f,
                                            10000.0f, 0.02f, 0, 0, NO_SCALING};
static const decoder_config llama2_7b = {4096, 32, 32, 32, 128, 11008, 32000, 4096, 1e-5f,
                                         10000.0f, 0.02f, 0, 0, NO_SCALING};
static const decoder_config llama2_13b = {5120, 40, 40, 40, 128, 13824, 32000, 4096, 1e-5f,
                                          10000.0f, 0.02f, 0, 0, NO_SCALING};
static const decoder_config llama2_70b = {8192, 80, 64, 8, 128, 28672, 32000, 4096, 1e-5f,
                                          10000.0f, 0.02f, 0, 0, NO_SCALING};
/* Llama-3.1 and 3.2 as their config.json files publish them (3.1-8B and 3.1-70B, whose
 * shape Llama-3.3-70B shares; Llama-3-8B is 3.1-8B with a context of 8192 and no
 * scaling): vocabulary 128,256, 8 KV heads, RoPE base 500,000 with Llama-3.1's bands over
 * an original context of 8192 (factor 8; 32 for 3.2), a context of 131,072; 3.2 ties the
 * embeddings. */
#define LLAMA31_ROPE SHLM_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192
#define LLAMA32_ROPE SHLM_ROPE_LLAMA3, 32.0f, 1.0f, 4.0f, 8192
static const decoder_config llama3_8b = {4096, 32, 32, 8, 128, 14336, 128256, 131072, 1e-5f,
                                         500000.0f, 0.02f, 0, 0, LLAMA31_ROPE};
static const decoder_config llama32_1b = {2048, 16, 32, 8, 64, 8192, 128256, 131072, 1e-5f,
                                          500000.0f, 0.02f, 1, 0, LLAMA32_ROPE};
static const decoder_config llama32_3b = {3072, 28, 24, 8, 128, 8192, 128256, 131072, 1e-5f,
                                          500000.0f, 0.02f, 1, 0, LLAMA32_ROPE};
static const decoder_config llama3_70b = {8192, 80, 64, 8, 128, 28672, 128256, 131072, 1e-5f,
                                          500000.0f, 0.02f, 0, 0, LLAMA31_ROPE};
static const model_preset llama_presets[] = {
    {"tiny", &tiny},
    {"tinyllama-1b", &tinyllama_1b},
    {"llama2-7b", &llama2_7b},
    {"llama2-13b", &llama2_13b},
    {"llama2-70b", &llama2_70b},
    {"llama3-8b", &llama3_8b},
    {"llama3.2-1b", &llama32_1b},
    {"llama3.2-3b", &llama32_3b},
    {"llama3-70b", &llama3_70b},
};

static const char *const architectures[] = {"LlamaForCausalLM", NULL};
static const char *const model_types[] = {"llama", NULL};

static void derive(void *shape, const unsigned char *set) { decoder_derive(shape, set); }

static int validate(const void *shape, char *err, size_t errlen, int blame[2]) {
    const decoder_config *c = shape;
    if (decoder_validate(c, err, errlen, blame) != 0) return -1;
    if (c->qkv_bias) { /* LlamaForCausalLM's attention_bias biases o_proj too */
        blame[0] = DK_QKV_BIAS;
        snprintf(err, errlen, "[model] qkv_bias = true: LlamaForCausalLM has no q/k/v-only "
                 "biases (model.family names an architecture that has them)");
        return -1;
    }
    return 0;
}

static int hf_read(const cJSON *j, const char *path, void *shape, char *err, size_t errlen) {
    decoder_config *c = shape;
    if (decoder_hf_read(j, path, c, err, errlen) != 0) return -1;
    int attention_bias, mlp_bias;
    if (hf_json_bool(j, "attention_bias", &attention_bias, path, err, errlen) ||
        hf_json_bool(j, "mlp_bias", &mlp_bias, path, err, errlen))
        return -1;
    if (attention_bias || mlp_bias) {
        io_set_err(err, errlen, "%s: attention_bias / mlp_bias are not supported", path);
        return -1;
    }
    return 0;
}

static int hf_write(const void *shape, cJSON *j, char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    cJSON *arch = cJSON_CreateArray();
    cJSON_AddItemToArray(arch, cJSON_CreateString(architectures[0]));
    hf_json_put(j, "architectures", arch);
    hf_json_put(j, "model_type", cJSON_CreateString(model_types[0]));
    decoder_hf_write(shape, j);
    hf_json_put(j, "attention_bias", cJSON_CreateBool(0));
    hf_json_put(j, "mlp_bias", cJSON_CreateBool(0));
    hf_json_put(j, "pretraining_tp", cJSON_CreateNumber(1));
    return 0;
}

const model_family llama_family = {
    .name = "llama",
    .title = "Llama (LlamaForCausalLM)",
    .shape_size = sizeof(decoder_config),
    .keys = llama_keys,
    .n_keys = DK_N,
    .hf_names = decoder_hf_names,
    .presets = llama_presets,
    .n_presets = (int)(sizeof llama_presets / sizeof llama_presets[0]),
    .hf_architectures = architectures,
    .hf_model_types = model_types,
    .derive = derive,
    .validate = validate,
    .hf_read = hf_read,
    .hf_write = hf_write,
    .chat_template = NULL,
    DECODER_FAMILY_MEMBERS,
};
