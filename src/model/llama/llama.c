/* The Llama family (llama.h): Llama-2's published shapes as presets, and the members of a
 * LlamaForCausalLM config.json that change the arithmetic and that shardlm does not
 * implement, refused by name rather than ignored. */
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
 * qkv_bias */
static const decoder_config tiny = {128, 4, 4, 2, 32, 352, 256, 256, 1e-5f, 10000.0f, 0.02f, 0, 0};
static const decoder_config tinyllama_1b = {2048, 22, 32, 4, 64, 5632, 32000, 2048, 1e-5f,
                                            10000.0f, 0.02f, 0, 0};
static const decoder_config llama2_7b = {4096, 32, 32, 32, 128, 11008, 32000, 4096, 1e-5f,
                                         10000.0f, 0.02f, 0, 0};
static const decoder_config llama2_13b = {5120, 40, 40, 40, 128, 13824, 32000, 4096, 1e-5f,
                                          10000.0f, 0.02f, 0, 0};
static const decoder_config llama2_70b = {8192, 80, 64, 8, 128, 28672, 32000, 4096, 1e-5f,
                                          10000.0f, 0.02f, 0, 0};
static const model_preset llama_presets[] = {
    {"tiny", &tiny},
    {"tinyllama-1b", &tinyllama_1b},
    {"llama2-7b", &llama2_7b},
    {"llama2-13b", &llama2_13b},
    {"llama2-70b", &llama2_70b},
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
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const cJSON *rt = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, "rope_type") : NULL;
    if (cJSON_IsString(rt) && strcmp(rt->valuestring, "default") != 0) {
        io_set_err(err, errlen, "%s: rope_parameters.rope_type \"%s\" is not supported (only "
                   "plain RoPE)", path, rt->valuestring);
        return -1;
    }
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (rs && !cJSON_IsNull(rs)) {
        io_set_err(err, errlen, "%s: rope_scaling is not supported (only plain RoPE)", path);
        return -1;
    }
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
    hf_json_put(j, "rope_scaling", cJSON_CreateNull());
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
