/* The Qwen2 family (Qwen2ForCausalLM: Qwen2, Qwen2.5): the decoder of src/model/decoder.h
 * with q/k/v biases, Qwen2.5's presets and config.json rules. Included by the registry
 * (src/families/) only. */
#ifndef SHLM_QWEN2_H
#define SHLM_QWEN2_H

#include "src/model/family.h"

extern const model_family qwen2_family;

#endif
