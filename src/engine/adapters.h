/* LoRA's adapters over a model's layout (src/engine/model.h "LoRA"): the tensors each
 * targeted projection gets, named as PEFT names them, the sites the model computes them at,
 * their scale and their initial values. Family-independent: a family marks its projections
 * (model_tensor.target) and groups them into products (model_unit.fp8); this file does the
 * rest for every family. */
#ifndef SHLM_ADAPTERS_H
#define SHLM_ADAPTERS_H

#include <stddef.h>
#include <stdint.h>

#include "src/engine/model.h"

/* Adapter tensor names: a base weight "P.weight" (P = model.layers.N.self_attn.q_proj) gets
 * "P.lora_A.weight" (r x in), "P.lora_B.weight" (out x r) and, with DoRA,
 * "P.lora_magnitude_vector" (out): PEFT's keys without their "base_model.model." prefix. */

/* Adds lc's adapters to a description made by model_desc_open (lc->rank 0: nothing):
 * m->lora, m->adapters (one adapter unit per unit of m->lay; units without a targeted
 * projection have no tensors) and m->lora_products. model_desc_close frees them. */
void adapters_open(model_desc *m, const lora_config *lc);

/* The same over a bare layout: *adapters and products (lay->n_units rows, malloc'd; the
 * caller frees them with model_layout_free and free). In unit u, for each product k of
 * lay's (fp8[k], in order), the A's of its targeted projections, then their B's, then their
 * magnitudes (DoRA). */
void adapters_layout(const model_layout *lay, const lora_config *lc, model_layout *adapters,
                     lora_product (**products)[MODEL_MAX_FP8_WEIGHTS]);

/* The factor of B·A: alpha / r, or alpha / √r with rslora (PEFT's scaling). */
float lora_scale(const lora_config *lc);

/* Initial values of elements [begin, end) of adapter unit u (model.h's init_slice
 * contract): A uniform in ±1/√in, drawn from (seed, unit, element) (PEFT's
 * kaiming_uniform_(a=√5)), B zero (the adapted model starts as the base), a DoRA magnitude
 * 1 until fsdp_lora_magnitudes sets it from the base. */
void adapters_init_slice(const model_layout *adapters, uint64_t seed, int u, size_t begin,
                         size_t end, float *out);

/* The module name of projection `target` in lay, as PEFT's target_modules names it: the
 * last component of its weight's name before ".weight" ("q_proj" of
 * model.layers.0.self_attn.q_proj.weight), into out; -1 when no tensor of lay is that
 * projection. */
int adapters_module_name(const model_layout *lay, int target, char *out, size_t outlen);

/* The base weight of adapter tensor t's projection (its unit's tensor index), found by
 * name: "P.lora_A.weight" belongs to "P.weight". -1 when there is none. */
int adapters_base_tensor(const model_unit *base, const model_tensor *t);

#endif
