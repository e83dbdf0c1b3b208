/* The [lora] keys' words and PEFT's names for them: lora.targets parsed and written, and an
 * adapter_config.json's target_modules mapped onto the model's projections. */
#ifndef SHLM_LORA_KEYS_H
#define SHLM_LORA_KEYS_H

#include <stddef.h>

#include "io/peft_adapter.h"
#include "src/engine/model.h"

/* lora.targets: words q k v o gate up down, attn (q k v o), mlp (gate up down) or all,
 * separated by blanks or commas, into a mask of 1 << model_target. 0, or -1 with the first
 * word that is none of them in bad (an empty list: bad ""). */
int lora_targets_parse(const char *text, unsigned *mask, char *bad, size_t badlen);
/* The mask as lora.targets' words ("q v"), in model_target order. */
void lora_targets_text(unsigned mask, char *out, size_t outlen);
/* target_modules of pc onto lay's projections (adapters_module_name): 0, or -1 with one
 * line naming a module that is none of them and those that are. */
int lora_targets_of_peft(const model_layout *lay, const peft_config *pc, unsigned *mask,
                         char *err, size_t errlen);

#endif
