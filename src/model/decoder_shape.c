/* The shape side of the decoder (decoder.h): derived fields and every rule of a shape,
 * config.json's common members, parameter and FLOP counts, and the glue that makes a
 * decoder family's compute members. */
#include "src/model/decoder.h"

#include <stdio.h>
#include <string.h>

#include "io/errmsg.h"
#include "io/hf_model.h"

const char *const decoder_hf_names[DK_N] = {
    [DK_DIM] = "hidden_size",
    [DK_N_LAYERS] = "num_hidden_layers",
    [DK_N_HEADS] = "num_attention_heads",
    [DK_N_KV_HEADS] = "num_key_value_heads",
    [DK_HEAD_DIM] = "head_dim",
    [DK_FFN_DIM] = "intermediate_size",
    [DK_VOCAB_SIZE] = "vocab_size",
    [DK_MAX_SEQ_LEN] = "max_position_embeddings",
    [DK_NORM_EPS] = "rms_norm_eps",
    [DK_ROPE_THETA] = "rope_theta",
    [DK_INIT_STD] = NULL, /* no config.json holds it */
    [DK_TIE_WORD_EMBEDDINGS] = "tie_word_embeddings",
    [DK_QKV_BIAS] = NULL, /* the family's architecture says it (Qwen2: always) */
    /* in rope_scaling (or rope_parameters, transformers 5's form) */
    [DK_ROPE_TYPE] = "rope_scaling.rope_type",
    [DK_ROPE_FACTOR] = "rope_scaling.factor",
    [DK_ROPE_LOW_FREQ_FACTOR] = "rope_scaling.low_freq_factor",
    [DK_ROPE_HIGH_FREQ_FACTOR] = "rope_scaling.high_freq_factor",
    [DK_ROPE_ORIGINAL_MAX_POS] = "rope_scaling.original_max_position_embeddings",
};

/* model.rope_type is a KT_ENUM over shlm_rope_type: its choices in the enum's order */
_Static_assert(sizeof(shlm_rope_type) == sizeof(int), "rope_type is an int-sized enum");
_Static_assert(SHLM_ROPE_DEFAULT == 0 && SHLM_ROPE_LINEAR == 1 && SHLM_ROPE_LLAMA3 == 2,
               "model.rope_type's choices are default|linear|llama3");

shlm_rope_params decoder_rope_params(const decoder_config *c) {
    return (shlm_rope_params){.type = c->rope_type,
                              .theta = (double)c->rope_theta,
                              .factor = (double)c->rope_factor,
                              .low_freq_factor = (double)c->rope_low_freq_factor,
                              .high_freq_factor = (double)c->rope_high_freq_factor,
                              .original_max_position_embeddings = c->rope_original_max_pos};
}

/* shlm_rope_check's fields as [model] keys */
static const int rope_key[SHLM_ROPE_N_FIELDS] = {
    [SHLM_ROPE_F_HEAD_DIM] = DK_HEAD_DIM,
    [SHLM_ROPE_F_THETA] = DK_ROPE_THETA,
    [SHLM_ROPE_F_TYPE] = DK_ROPE_TYPE,
    [SHLM_ROPE_F_FACTOR] = DK_ROPE_FACTOR,
    [SHLM_ROPE_F_LOW_FREQ_FACTOR] = DK_ROPE_LOW_FREQ_FACTOR,
    [SHLM_ROPE_F_HIGH_FREQ_FACTOR] = DK_ROPE_HIGH_FREQ_FACTOR,
    [SHLM_ROPE_F_ORIGINAL_MAX_POS] = DK_ROPE_ORIGINAL_MAX_POS,
};
static const char *const rope_key_names[SHLM_ROPE_N_FIELDS] = {
    [SHLM_ROPE_F_HEAD_DIM] = "head_dim",
    [SHLM_ROPE_F_THETA] = "rope_theta",
    [SHLM_ROPE_F_TYPE] = "rope_type",
    [SHLM_ROPE_F_FACTOR] = "rope_factor",
    [SHLM_ROPE_F_LOW_FREQ_FACTOR] = "rope_low_freq_factor",
    [SHLM_ROPE_F_HIGH_FREQ_FACTOR] = "rope_high_freq_factor",
    [SHLM_ROPE_F_ORIGINAL_MAX_POS] = "rope_original_max_position_embeddings",
};

void decoder_derive(decoder_config *c, const unsigned char *set) {
    if (!set[DK_N_KV_HEADS]) c->n_kv_heads = c->n_heads;
    if (!set[DK_HEAD_DIM] && c->n_heads > 0) c->head_dim = c->dim / c->n_heads;
}

int decoder_validate(const decoder_config *c, char *err, size_t errlen, int blame[2]) {
    blame[0] = blame[1] = -1;
#define BAD(a, b, ...)                            \
    do {                                          \
        blame[0] = (a);                           \
        blame[1] = (b);                           \
        snprintf(err, errlen, __VA_ARGS__);       \
        return -1;                                \
    } while (0)
    /* what the keys' bounds already say of a job's values; a shape read from a checkpoint
     * or a config.json comes here too */
    if (c->dim <= 0) BAD(-1, -1, "model.dim must be > 0 (got %d)", c->dim);
    if (c->n_layers <= 0) BAD(-1, -1, "model.n_layers must be > 0 (got %d)", c->n_layers);
    if (c->n_heads <= 0) BAD(-1, -1, "model.n_heads must be > 0 (got %d)", c->n_heads);
    if (c->n_kv_heads <= 0) BAD(-1, -1, "model.n_kv_heads must be > 0 (got %d)", c->n_kv_heads);
    if (c->ffn_dim <= 0) BAD(-1, -1, "model.ffn_dim must be > 0 (got %d)", c->ffn_dim);
    if (c->vocab_size <= 1) BAD(-1, -1, "model.vocab_size must be > 1 (got %d)", c->vocab_size);
    if (c->max_seq_len <= 0) BAD(-1, -1, "model.max_seq_len must be > 0 (got %d)", c->max_seq_len);
    if (!(c->norm_eps > 0)) BAD(-1, -1, "model.norm_eps must be > 0 (got %g)", c->norm_eps);
    if (!(c->rope_theta > 0)) BAD(-1, -1, "model.rope_theta must be > 0 (got %g)", c->rope_theta);
    if (!(c->init_std > 0)) BAD(-1, -1, "model.init_std must be > 0 (got %g)", c->init_std);
    if (c->tie_word_embeddings != 0 && c->tie_word_embeddings != 1)
        BAD(-1, -1, "model.tie_word_embeddings must be 0 or 1 (got %d)", c->tie_word_embeddings);
    if (c->qkv_bias != 0 && c->qkv_bias != 1)
        BAD(-1, -1, "model.qkv_bias must be 0 or 1 (got %d)", c->qkv_bias);
    /* the rules between keys */
    if (c->dim % c->n_heads != 0)
        BAD(DK_DIM, DK_N_HEADS, "[model] dim = %d is not divisible by n_heads = %d", c->dim,
            c->n_heads);
    if (c->n_heads % c->n_kv_heads != 0)
        BAD(DK_N_KV_HEADS, DK_N_HEADS, "[model] n_kv_heads = %d does not divide n_heads = %d",
            c->n_kv_heads, c->n_heads);
    if (c->head_dim != c->dim / c->n_heads)
        BAD(DK_HEAD_DIM, DK_DIM, "[model] head_dim = %d is not dim / n_heads = %d (the only "
            "head width shardlm implements)", c->head_dim, c->dim / c->n_heads);
    if (c->head_dim % 2 != 0) BAD(-1, -1, "head_dim (%d) must be even for RoPE", c->head_dim);
    /* RoPE's type and parameters: kernels/rope_freq.h's rules, then no parameter the type
     * does not use (a factor given without its type would change nothing, silently) */
    const shlm_rope_params rp = decoder_rope_params(c);
    shlm_rope_field f;
    char why[256];
    if (shlm_rope_check(c->head_dim, &rp, rope_key_names, &f, why, sizeof why) != 0)
        BAD(rope_key[f], f == SHLM_ROPE_F_TYPE ? -1 : DK_ROPE_TYPE, "[model] %s", why);
    const int llama3 = c->rope_type == SHLM_ROPE_LLAMA3;
    const struct {
        shlm_rope_field f;
        int used;
        double v;
    } unused[] = {
        {SHLM_ROPE_F_FACTOR, c->rope_type != SHLM_ROPE_DEFAULT, c->rope_factor},
        {SHLM_ROPE_F_LOW_FREQ_FACTOR, llama3, c->rope_low_freq_factor},
        {SHLM_ROPE_F_HIGH_FREQ_FACTOR, llama3, c->rope_high_freq_factor},
        {SHLM_ROPE_F_ORIGINAL_MAX_POS, llama3, c->rope_original_max_pos},
    };
    for (size_t i = 0; i < sizeof unused / sizeof unused[0]; i++)
        if (!unused[i].used && unused[i].v != 0)
            BAD(rope_key[unused[i].f], DK_ROPE_TYPE, "[model] %s = %g is not used by rope_type "
                "%s (0, or a rope_type that takes it)", rope_key_names[unused[i].f], unused[i].v,
                shlm_rope_type_name(c->rope_type));
    return 0;
#undef BAD
}

/* The object of config.json that says RoPE's type: rope_scaling where it is one (the Hub's
 * form; transformers 5 takes it over rope_parameters too), else transformers 5's
 * rope_parameters, else NULL (none: default). */
static const cJSON *rope_type_object(const cJSON *j, const char **name) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, *name = "rope_scaling");
    if (cJSON_IsObject(o)) return o;
    o = cJSON_GetObjectItemCaseSensitive(j, *name = "rope_parameters");
    return cJSON_IsObject(o) ? o : NULL;
}

/* RoPE's type and the parameters it uses (rope_type_object's; a rope_scaling that is
 * neither null nor an object, or one without a type, is refused) into c. */
static int read_rope_scaling(const cJSON *j, const char *path, decoder_config *c, char *err,
                             size_t errlen) {
    const char *name;
    const cJSON *o = rope_type_object(j, &name);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (rs && !cJSON_IsNull(rs) && !cJSON_IsObject(rs)) {
        io_set_err(err, errlen, "%s: rope_scaling must be null or an object", path);
        return -1;
    }
    c->rope_type = SHLM_ROPE_DEFAULT;
    c->rope_factor = c->rope_low_freq_factor = c->rope_high_freq_factor = 0;
    c->rope_original_max_pos = 0;
    if (!o) return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(o, "type"); /* the older name */
    if (!cJSON_IsString(t)) {
        if (o == rs) { /* transformers 5's rope_parameters may hold rope_theta alone */
            io_set_err(err, errlen, "%s: rope_scaling has no \"rope_type\" (a string)", path);
            return -1;
        }
        return 0;
    }
    if (shlm_rope_type_parse(t->valuestring, &c->rope_type) != 0) {
        io_set_err(err, errlen, "%s: %s.rope_type \"%.40s\" is not supported (shardlm implements "
                   "%s)", path, name, t->valuestring, shlm_rope_type_names());
        return -1;
    }
    char where[1200];
    snprintf(where, sizeof where, "%s: %s", path, name);
    double factor = 0, low = 0, high = 0;
    int orig = 0;
    if ((c->rope_type != SHLM_ROPE_DEFAULT &&
         hf_json_double(o, "factor", 0, &factor, where, err, errlen)) ||
        (c->rope_type == SHLM_ROPE_LLAMA3 &&
         (hf_json_double(o, "low_freq_factor", 0, &low, where, err, errlen) ||
          hf_json_double(o, "high_freq_factor", 0, &high, where, err, errlen) ||
          hf_json_int(o, "original_max_position_embeddings", 0, &orig, where, err, errlen))))
        return -1;
    c->rope_factor = (float)factor;
    c->rope_low_freq_factor = (float)low;
    c->rope_high_freq_factor = (float)high;
    c->rope_original_max_pos = orig;
    /* what shlm_rope_init needs, in config.json's names (head_dim is checked later) */
    const shlm_rope_params p = {c->rope_type, 1.0, factor, low, high, orig};
    char why[256];
    if (shlm_rope_check(2, &p, NULL, NULL, why, sizeof why) != 0) {
        io_set_err(err, errlen, "%s: %s", where, why);
        return -1;
    }
    return 0;
}

int decoder_hf_read(const cJSON *j, const char *path, decoder_config *c, char *err,
                    size_t errlen) {
    if (hf_json_int(j, "hidden_size", -1, &c->dim, path, err, errlen) ||
        hf_json_int(j, "num_hidden_layers", -1, &c->n_layers, path, err, errlen) ||
        hf_json_int(j, "num_attention_heads", -1, &c->n_heads, path, err, errlen) ||
        hf_json_int(j, "intermediate_size", -1, &c->ffn_dim, path, err, errlen) ||
        hf_json_int(j, "vocab_size", -1, &c->vocab_size, path, err, errlen) ||
        hf_json_int(j, "num_key_value_heads", c->n_heads, &c->n_kv_heads, path, err, errlen) ||
        hf_json_int(j, "max_position_embeddings", 2048, &c->max_seq_len, path, err, errlen))
        return -1;
    double eps, theta;
    if (hf_json_double(j, "rms_norm_eps", 1e-6, &eps, path, err, errlen)) return -1;
    if (c->n_heads < 1 || c->dim % c->n_heads != 0) {
        io_set_err(err, errlen, "%s: hidden_size %d is not a multiple of num_attention_heads %d",
                   path, c->dim, c->n_heads);
        return -1;
    }
    if (hf_json_int(j, "head_dim", c->dim / c->n_heads, &c->head_dim, path, err, errlen))
        return -1;
    if (c->head_dim != c->dim / c->n_heads) {
        io_set_err(err, errlen, "%s: head_dim = %d, but shardlm's is hidden_size / "
                   "num_attention_heads = %d", path, c->head_dim, c->dim / c->n_heads);
        return -1;
    }
    /* newer transformers keep rope_theta inside rope_parameters */
    if (hf_json_double(j, "rope_theta", 10000.0, &theta, path, err, errlen)) return -1;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (cJSON_IsObject(rp) && hf_json_double(rp, "rope_theta", theta, &theta, path, err, errlen))
        return -1;
    if (read_rope_scaling(j, path, c, err, errlen) != 0) return -1;
    if (hf_json_bool(j, "tie_word_embeddings", &c->tie_word_embeddings, path, err, errlen))
        return -1;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0) {
        io_set_err(err, errlen, "%s: hidden_act \"%s\" is not supported (only silu)", path,
                   act->valuestring);
        return -1;
    }
    c->norm_eps = (float)eps;
    c->rope_theta = (float)theta;
    return 0;
}

/* RoPE's type and parameters into the object rope_type_object reads, in its form: a
 * rope_scaling object of the source keeps "type" where it named the type so; none (a
 * config.json of the Hub's form, or a new one): rope_scaling. A rope_scaling is null for
 * default. The parameters the type does not use are removed. */
static void write_rope_scaling(const decoder_config *c, cJSON *j) {
    const char *name;
    cJSON *o = (cJSON *)rope_type_object(j, &name);
    if ((!o || strcmp(name, "rope_scaling") == 0) && c->rope_type == SHLM_ROPE_DEFAULT) {
        hf_json_put(j, "rope_scaling", cJSON_CreateNull());
        return;
    }
    if (!o) {
        o = cJSON_CreateObject();
        hf_json_put(j, "rope_scaling", o);
    }
    /* a rope_theta inside rope_scaling (transformers 5 writes one there too) follows the
     * top-level one */
    if (strcmp(name, "rope_scaling") == 0 && cJSON_HasObjectItem(o, "rope_theta"))
        hf_json_put(o, "rope_theta", cJSON_CreateNumber(hf_float_decimal(c->rope_theta)));
    const char *type = shlm_rope_type_name(c->rope_type);
    const int old_name = cJSON_HasObjectItem(o, "type") && !cJSON_HasObjectItem(o, "rope_type");
    hf_json_put(o, old_name ? "type" : "rope_type", cJSON_CreateString(type));
    if (cJSON_HasObjectItem(o, "type") && !old_name) hf_json_put(o, "type", cJSON_CreateString(type));
    const int llama3 = c->rope_type == SHLM_ROPE_LLAMA3;
    const struct {
        const char *key;
        int used;
        cJSON *v;
    } member[] = {
        {"factor", c->rope_type != SHLM_ROPE_DEFAULT, hf_json_float(c->rope_factor)},
        {"low_freq_factor", llama3, hf_json_float(c->rope_low_freq_factor)},
        {"high_freq_factor", llama3, hf_json_float(c->rope_high_freq_factor)},
        {"original_max_position_embeddings", llama3, cJSON_CreateNumber(c->rope_original_max_pos)},
    };
    for (size_t i = 0; i < sizeof member / sizeof member[0]; i++) {
        if (member[i].used) {
            hf_json_put(o, member[i].key, member[i].v);
        } else {
            cJSON_DeleteItemFromObjectCaseSensitive(o, member[i].key);
            cJSON_Delete(member[i].v);
        }
    }
}

void decoder_hf_write(const decoder_config *c, cJSON *j) {
    hf_json_put(j, "hidden_size", cJSON_CreateNumber(c->dim));
    hf_json_put(j, "intermediate_size", cJSON_CreateNumber(c->ffn_dim));
    hf_json_put(j, "num_hidden_layers", cJSON_CreateNumber(c->n_layers));
    hf_json_put(j, "num_attention_heads", cJSON_CreateNumber(c->n_heads));
    hf_json_put(j, "num_key_value_heads", cJSON_CreateNumber(c->n_kv_heads));
    hf_json_put(j, "head_dim", cJSON_CreateNumber(c->head_dim));
    hf_json_put(j, "vocab_size", cJSON_CreateNumber(c->vocab_size));
    hf_json_put(j, "max_position_embeddings", cJSON_CreateNumber(c->max_seq_len));
    hf_json_put(j, "rms_norm_eps", cJSON_CreateNumber(hf_float_decimal(c->norm_eps)));
    cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const double theta = hf_float_decimal(c->rope_theta);
    if (cJSON_IsObject(rp)) hf_json_put(rp, "rope_theta", cJSON_CreateNumber(theta));
    else hf_json_put(j, "rope_theta", cJSON_CreateNumber(theta));
    write_rope_scaling(c, j);
    hf_json_put(j, "hidden_act", cJSON_CreateString("silu"));
    hf_json_put(j, "tie_word_embeddings", cJSON_CreateBool(c->tie_word_embeddings));
    if (!cJSON_GetObjectItemCaseSensitive(j, "initializer_range"))
        cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    if (!cJSON_GetObjectItemCaseSensitive(j, "use_cache")) cJSON_AddBoolToObject(j, "use_cache", 1);
}

const char *decoder_hf_unused(const void *shape, const char *tensor) {
    const decoder_config *c = shape;
    int l = -1, n = 0;
    if (c->tie_word_embeddings && strcmp(tensor, "lm_head.weight") == 0)
        return "the head is the embedding (tie_word_embeddings)";
    if (sscanf(tensor, "model.layers.%d.self_attn.rotary_emb.inv_freq%n", &l, &n) == 1 && n > 0 &&
        tensor[n] == '\0' && l >= 0 && l < c->n_layers)
        return "RoPE's frequencies are recomputed from rope_theta";
    return NULL;
}

int64_t decoder_param_count(const decoder_config *c) {
    int64_t d = c->dim, hd = c->head_dim, F = c->ffn_dim, V = c->vocab_size;
    const int64_t qkv = (c->n_heads + 2 * (int64_t)c->n_kv_heads) * hd;
    int64_t block = 2 * d + qkv * d + d * c->n_heads * hd + 3 * F * d + (c->qkv_bias ? qkv : 0);
    return V * d + c->n_layers * block + d + (c->tie_word_embeddings ? 0 : V * d);
}

double decoder_flops_per_token(const decoder_config *c, int T) {
    return 6.0 * (double)decoder_param_count(c) + 12.0 * c->n_layers * (double)c->dim * T;
}

/* ---- a decoder family's members (DECODER_FAMILY_MEMBERS) ---- */

void *decoder_family_create(const void *shape, const shlm_ops *ops, int B, int T,
                            const model_opts *o, model_param_source src) {
    return decoder_create(shape, ops, B, T, o, src);
}
void decoder_family_destroy(void *impl) { decoder_destroy(impl); }
double decoder_family_fwd_bwd(void *impl, const model_batch *b, float grad_scale, int *n_valid) {
    return decoder_forward_backward(impl, b, grad_scale, n_valid);
}
double decoder_family_forward(void *impl, const model_batch *b, int *n_valid, float *logits_out,
                              float *last_logits_out) {
    return decoder_forward(impl, b, n_valid, logits_out, last_logits_out);
}
size_t decoder_family_act_bytes(const void *impl) { return decoder_activation_bytes(impl); }
void decoder_family_set_profile(void *impl, int on) { decoder_set_profile(impl, on); }
void decoder_family_take_profile(void *impl, double *seconds) {
    decoder_take_profile(impl, seconds);
}
int64_t decoder_family_param_count(const void *shape) { return decoder_param_count(shape); }
double decoder_family_flops(const void *shape, int T) {
    return decoder_flops_per_token(shape, T);
}
int decoder_family_vocab_size(const void *shape) {
    return ((const decoder_config *)shape)->vocab_size;
}
int decoder_family_max_seq_len(const void *shape) {
    return ((const decoder_config *)shape)->max_seq_len;
}
void decoder_family_set_max_seq_len(void *shape, int T) {
    ((decoder_config *)shape)->max_seq_len = T;
}
void *decoder_family_gen_create(void *impl, int rows, int cap) {
    return decoder_gen_create(impl, rows, cap);
}
void decoder_family_gen_destroy(void *gen) { decoder_gen_destroy(gen); }
void decoder_family_gen_prefill(void *gen, int n, const int *rows,
                                const int32_t *const *prompts, const int *lens, float *logits) {
    decoder_gen_prefill(gen, n, rows, prompts, lens, logits);
}
void decoder_family_gen_decode(void *gen, int n, const int *rows, const int32_t *tokens,
                               float *logits) {
    decoder_gen_decode(gen, n, rows, tokens, logits);
}
size_t decoder_family_gen_bytes(const void *gen) { return decoder_gen_bytes(gen); }
