/* The registry of model families: the one place that names them (one line each in
 * families.c) and the only includer of a family's header. Lookups by family name, by
 * preset name (presets are unique across families) and by a Hugging Face config.json. */
#ifndef SHLM_FAMILIES_H
#define SHLM_FAMILIES_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "src/model/family.h"

/* Every family, NULL-terminated, the default (llama) first. */
extern const model_family *const model_families[];

/* The family called name, or NULL. */
const model_family *family_named(const char *name);
/* The family whose preset is called name, and the preset (NULL when none has it). */
const model_family *family_of_preset(const char *name, const model_preset **preset);
/* The family that reads a config.json (j, read from path): its architectures[0] first,
 * else its model_type. 0, or -1 with one line naming what the file says and the
 * architectures the families read. */
int family_of_hf(const cJSON *j, const char *path, const model_family **out, char *err,
                 size_t errlen);
/* "llama ..." (the families' names), "tiny tinyllama-1b ..." (every preset), and the
 * architectures they read, for messages. */
const char *family_names(void);
const char *family_preset_names(void);
const char *family_architectures(void);

/* The shape of Hugging Face directory dir (its config.json): family_of_hf, then the family's
 * hf_read over its defaults, derived fields and validation. */
int family_shape_from_hf(const char *dir, model_shape *shape, char *err, size_t errlen);
/* A shape with every key of family f at its default (keys without one are 0). */
void family_shape_defaults(const model_family *f, model_shape *shape);

#endif
