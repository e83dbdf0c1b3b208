/* PEFT adapter directories (Hugging Face PEFT's save_pretrained of a LoRA model):
 * adapter_config.json read into the members shardlm implements, anything it does not
 * implement refused by name, and written back; the tensors live beside it in
 * adapter_model.safetensors (io/safetensors.h), keyed "base_model.model." + the adapter
 * tensor's name. This layer knows the files, not a model: module names stay PEFT's
 * ("q_proj"). Every function returns 0, or -1 with one line naming the file in err. */
#ifndef SHLM_PEFT_ADAPTER_H
#define SHLM_PEFT_ADAPTER_H

#include <stddef.h>

enum { PEFT_MAX_MODULES = 16 };

/* The key prefix of adapter_model.safetensors' tensors (PeftModelForCausalLM's). */
#define PEFT_KEY_PREFIX "base_model.model."
#define PEFT_CONFIG_FILE "adapter_config.json"
#define PEFT_WEIGHTS_FILE "adapter_model.safetensors"

typedef struct peft_config {
    int r;
    double lora_alpha;
    double lora_dropout;
    int n_modules;
    char modules[PEFT_MAX_MODULES][64]; /* target_modules, e.g. "q_proj" */
    int use_rslora, use_dora;
    char base_model[1024];              /* base_model_name_or_path ("" when null) */
} peft_config;

/* Reads DIR/adapter_config.json. r and lora_alpha must be there: PEFT's defaults for a
 * missing one (8, 8) would silently change the scale alpha/r. peft_type must be LORA, the
 * task CAUSAL_LM (or unset), target_modules a list of names (not a regular expression), and
 * what would change the arithmetic beyond r, alpha, rsLoRA and DoRA (bias, rank_pattern,
 * alpha_pattern, modules_to_save, layers_to_transform, fan_in_fan_out, ...) unset. */
int peft_config_read(const char *dir, peft_config *out, char *err, size_t errlen);
/* Writes DIR/adapter_config.json for c (peft_type LORA, task_type CAUSAL_LM, bias none),
 * through a temporary file renamed into place. */
int peft_config_write(const char *dir, const peft_config *c, char *err, size_t errlen);

#endif
