/* The Llama family (LlamaForCausalLM): the decoder of src/model/decoder.h with Llama's
 * presets and config.json rules. Included by the registry (src/families/) only. */
#ifndef SHLM_LLAMA_H
#define SHLM_LLAMA_H

#include "src/model/family.h"

extern const model_family llama_family;

#endif
