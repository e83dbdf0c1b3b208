/* PEFT's adapter_config.json (peft_adapter.h). */
#include "io/peft_adapter.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "io/errmsg.h"
#include "io/hf_model.h"

/* Members that, set, would make the adapter compute what shardlm does not: each must be
 * absent, null, false, "none" or empty ({} or []). */
static const char *const unsupported[] = {
    "rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform",
    "layers_pattern", "fan_in_fan_out", "lora_bias", "use_qalora", "target_parameters",
    "exclude_modules", "layer_replication", "trainable_token_indices", "use_bdlora",
    "alora_invocation_tokens", "megatron_config", "arrow_config"};

static int is_unset(const cJSON *v) {
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 1;
    if ((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child) return 1;
    return cJSON_IsString(v) && (!v->valuestring[0] || strcmp(v->valuestring, "none") == 0);
}

int peft_config_read(const char *dir, peft_config *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, PEFT_CONFIG_FILE);
    cJSON *j;
    if (hf_json_load(path, &j, err, errlen) != 0) return -1;
    int rc = -1;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    if (!cJSON_IsString(v) || strcmp(v->valuestring, "LORA") != 0) {
        io_set_err(err, errlen, "%s: peft_type is %s%s%s, not \"LORA\": not a LoRA adapter", path,
                   cJSON_IsString(v) ? "\"" : "", cJSON_IsString(v) ? v->valuestring : "missing",
                   cJSON_IsString(v) ? "\"" : "");
        goto done;
    }
    v = cJSON_GetObjectItemCaseSensitive(j, "task_type");
    if (v && !cJSON_IsNull(v) && (!cJSON_IsString(v) || strcmp(v->valuestring, "CAUSAL_LM") != 0)) {
        io_set_err(err, errlen, "%s: task_type is not CAUSAL_LM: shardlm trains causal language "
                   "models", path);
        goto done;
    }
    v = cJSON_GetObjectItemCaseSensitive(j, "bias");
    if (!is_unset(v)) {
        io_set_err(err, errlen, "%s: bias = %s: trained biases are not supported (only \"none\")",
                   path, cJSON_IsString(v) ? v->valuestring : "(not a string)");
        goto done;
    }
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (!is_unset(cJSON_GetObjectItemCaseSensitive(j, unsupported[i]))) {
            io_set_err(err, errlen, "%s: %s is set: not supported (shardlm's LoRA has one rank and "
                       "alpha for every adapted projection of every layer, and nothing else "
                       "trained)", path, unsupported[i]);
            goto done;
        }
    /* r and lora_alpha must be given: PEFT's defaults would pick the scale silently */
    const char *required[] = {"r", "lora_alpha"};
    for (int i = 0; i < 2; i++) {
        v = cJSON_GetObjectItemCaseSensitive(j, required[i]);
        if (!v || cJSON_IsNull(v)) {
            io_set_err(err, errlen, "%s: no %s: PEFT would take its default (%s 8) and so a "
                       "scale alpha/r nobody chose; the file must say it", path, required[i],
                       required[i]);
            goto done;
        }
    }
    if (hf_json_int(j, "r", -1, &out->r, path, err, errlen) != 0) goto done;
    if (out->r < 1) {
        io_set_err(err, errlen, "%s: r = %d: must be at least 1", path, out->r);
        goto done;
    }
    if (hf_json_double(j, "lora_alpha", 0, &out->lora_alpha, path, err, errlen) != 0) goto done;
    v = cJSON_GetObjectItemCaseSensitive(j, "lora_dropout");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 1)) {
            io_set_err(err, errlen, "%s: lora_dropout must be a number in [0, 1)", path);
            goto done;
        }
        out->lora_dropout = v->valuedouble;
    }
    if (hf_json_bool(j, "use_rslora", &out->use_rslora, path, err, errlen) != 0 ||
        hf_json_bool(j, "use_dora", &out->use_dora, path, err, errlen) != 0)
        goto done;
    v = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    if (cJSON_IsString(v)) {
        io_set_err(err, errlen, "%s: target_modules is a regular expression (\"%s\"): only a list "
                   "of module names is supported", path, v->valuestring);
        goto done;
    }
    if (!cJSON_IsArray(v) || !v->child) {
        io_set_err(err, errlen, "%s: target_modules must be a non-empty list of module names", path);
        goto done;
    }
    for (const cJSON *e = v->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strlen(e->valuestring) >= 64 ||
            out->n_modules == PEFT_MAX_MODULES) {
            io_set_err(err, errlen, "%s: target_modules must be at most %d names of at most 63 "
                       "characters", path, PEFT_MAX_MODULES);
            goto done;
        }
        snprintf(out->modules[out->n_modules++], 64, "%s", e->valuestring);
    }
    v = cJSON_GetObjectItemCaseSensitive(j, "base_model_name_or_path");
    if (cJSON_IsString(v)) snprintf(out->base_model, sizeof out->base_model, "%s", v->valuestring);
    rc = 0;
done:
    cJSON_Delete(j);
    return rc;
}

int peft_config_write(const char *dir, const peft_config *c, char *err, size_t errlen) {
    cJSON *j = cJSON_CreateObject();
    cJSON *mods = cJSON_CreateArray();
    for (int i = 0; i < c->n_modules; i++) cJSON_AddItemToArray(mods, cJSON_CreateString(c->modules[i]));
    cJSON_AddItemToObject(j, "peft_type", cJSON_CreateString("LORA"));
    cJSON_AddItemToObject(j, "task_type", cJSON_CreateString("CAUSAL_LM"));
    cJSON_AddItemToObject(j, "base_model_name_or_path",
                          c->base_model[0] ? cJSON_CreateString(c->base_model) : cJSON_CreateNull());
    cJSON_AddItemToObject(j, "r", cJSON_CreateNumber(c->r));
    cJSON_AddItemToObject(j, "lora_alpha", cJSON_CreateNumber(hf_float_decimal(c->lora_alpha)));
    cJSON_AddItemToObject(j, "lora_dropout", cJSON_CreateNumber(hf_float_decimal(c->lora_dropout)));
    cJSON_AddItemToObject(j, "target_modules", mods);
    cJSON_AddItemToObject(j, "use_rslora", cJSON_CreateBool(c->use_rslora));
    cJSON_AddItemToObject(j, "use_dora", cJSON_CreateBool(c->use_dora));
    cJSON_AddItemToObject(j, "bias", cJSON_CreateString("none"));
    cJSON_AddItemToObject(j, "fan_in_fan_out", cJSON_CreateFalse());
    cJSON_AddItemToObject(j, "inference_mode", cJSON_CreateTrue());
    cJSON_AddItemToObject(j, "init_lora_weights", cJSON_CreateTrue());
    cJSON_AddItemToObject(j, "modules_to_save", cJSON_CreateNull());
    return hf_json_save(j, dir, PEFT_CONFIG_FILE, err, errlen);
}
