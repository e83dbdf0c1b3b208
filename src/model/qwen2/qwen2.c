/* The Qwen2 family (qwen2.h): Llama's decoder with biases on the q, k and v projections
 * (always: Qwen2ForCausalLM builds them whatever config.json says), RoPE base 1e6 by
 * default, Qwen2.5's published shapes as presets (0.5B and 1.5B tie the embeddings), and
 * the members of a Qwen2 config.json that change the arithmetic and that shardlm does not
 * implement (sliding-window attention, RoPE scaling) refused by name rather than
 * ignored. */
#include "src/model/qwen2/qwen2.h"

#include <stdio.h>
#include <string.h>

#include "io/errmsg.h"
#include "io/hf_model.h"
#include "src/model/decoder.h"

_Static_assert(sizeof(decoder_config) <= MODEL_SHAPE_BYTES, "a Qwen2 shape fits model_shape");

static const key_def qwen2_keys[] = {DECODER_KEY_ROWS("1000000", "true")};
_Static_assert(sizeof qwen2_keys / sizeof qwen2_keys[0] == DK_N, "one row per decoder key");

/* Qwen2.5's config.json (the base models): dim, layers, heads, kv heads, head_dim, ffn,
 * vocab, max_seq (max_position_embeddings), eps, theta, init_std (initializer_range),
 * tied, qkv_bias, RoPE scaling (none). The 7B's vocabulary is 152,064 rows (padded), the
 * smaller ones' 151,936. */
static const decoder_config qwen25_0_5b = {896, 24, 14, 2, 64, 4864, 151936, 32768, 1e-6f,
                                           1e6f, 0.02f, 1, 1, SHLM_ROPE_DEFAULT, 0, 0, 0, 0};
static const decoder_config qwen25_1_5b = {1536, 28, 12, 2, 128, 8960, 151936, 131072, 1e-6f,
                                           1e6f, 0.02f, 1, 1, SHLM_ROPE_DEFAULT, 0, 0, 0, 0};
static const decoder_config qwen25_7b = {3584, 28, 28, 4, 128, 18944, 152064, 131072, 1e-6f,
                                         1e6f, 0.02f, 0, 1, SHLM_ROPE_DEFAULT, 0, 0, 0, 0};
static const model_preset qwen2_presets[] = {
    {"qwen2.5-0.5b", &qwen25_0_5b},
    {"qwen2.5-1.5b", &qwen25_1_5b},
    {"qwen2.5-7b", &qwen25_7b},
};

static const char *const architectures[] = {"Qwen2ForCausalLM", NULL};
static const char *const model_types[] = {"qwen2", NULL};

static void derive(void *shape, const unsigned char *set) { decoder_derive(shape, set); }

static int validate(const void *shape, char *err, size_t errlen, int blame[2]) {
    const decoder_config *c = shape;
    if (decoder_validate(c, err, errlen, blame) != 0) return -1;
    if (!c->qkv_bias) {
        blame[0] = DK_QKV_BIAS;
        snprintf(err, errlen, "[model] qkv_bias = false: Qwen2's q, k and v projections always "
                 "have biases");
        return -1;
    }
    /* RoPE scaling (config.json's rope_scaling, a job's rope_type) is the Llama family's:
     * no Qwen2 checkpoint this family is tested against has any */
    if (c->rope_type != SHLM_ROPE_DEFAULT) {
        blame[0] = DK_ROPE_TYPE;
        snprintf(err, errlen, "[model] rope_type = %s: the qwen2 family takes plain RoPE only "
                 "(rope_theta; rope scaling is not supported)", shlm_rope_type_name(c->rope_type));
        return -1;
    }
    return 0;
}

/* Sliding-window attention in either of config.json's forms: use_sliding_window (true:
 * the layers from max_window_layers on attend to a window), or transformers 5's per-layer
 * layer_types. shardlm's attention is full causal everywhere. */
static int refuse_sliding_window(const cJSON *j, const char *path, char *err, size_t errlen) {
    int sliding;
    if (hf_json_bool(j, "use_sliding_window", &sliding, path, err, errlen)) return -1;
    if (sliding) {
        io_set_err(err, errlen, "%s: use_sliding_window = true: sliding-window attention is not "
                   "supported (shardlm's attention is full causal)", path);
        return -1;
    }
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (!cJSON_IsArray(types)) return 0;
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, types) {
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "full_attention") != 0) {
            io_set_err(err, errlen, "%s: layer_types[%d] = %s: only full_attention layers are "
                       "supported", path, i, cJSON_IsString(t) ? t->valuestring : "(not a string)");
            return -1;
        }
        i++;
    }
    return 0;
}

static int hf_read(const cJSON *j, const char *path, void *shape, char *err, size_t errlen) {
    decoder_config *c = shape;
    if (decoder_hf_read(j, path, c, err, errlen) != 0) return -1;
    c->qkv_bias = 1;
    if (refuse_sliding_window(j, path, err, errlen) != 0) return -1;
    return 0;
}

static int hf_write(const void *shape, cJSON *j, char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    const decoder_config *c = shape;
    cJSON *arch = cJSON_CreateArray();
    cJSON_AddItemToArray(arch, cJSON_CreateString(architectures[0]));
    hf_json_put(j, "architectures", arch);
    hf_json_put(j, "model_type", cJSON_CreateString(model_types[0]));
    decoder_hf_write(c, j);
    hf_json_put(j, "use_sliding_window", cJSON_CreateBool(0));
    return 0;
}

const model_family qwen2_family = {
    .name = "qwen2",
    .title = "Qwen2 (Qwen2ForCausalLM: Qwen2, Qwen2.5)",
    .shape_size = sizeof(decoder_config),
    .keys = qwen2_keys,
    .n_keys = DK_N,
    .hf_names = decoder_hf_names,
    .presets = qwen2_presets,
    .n_presets = (int)(sizeof qwen2_presets / sizeof qwen2_presets[0]),
    .hf_architectures = architectures,
    .hf_model_types = model_types,
    .derive = derive,
    .validate = validate,
    .hf_read = hf_read,
    .hf_write = hf_write,
    .chat_template = "qwen2.5",
    DECODER_FAMILY_MEMBERS,
};
