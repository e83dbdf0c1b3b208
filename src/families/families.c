/* The registry (families.h): a family is one line of model_families. */
#include "src/families/families.h"

#include <stdio.h>
#include <string.h>

#include "io/errmsg.h"
#include "io/hf_model.h"
#include "src/model/llama/llama.h"
#include "src/model/qwen2/qwen2.h"

const model_family *const model_families[] = {
    &llama_family,
    &qwen2_family,
    NULL,
};

const model_family *family_named(const char *name) {
    for (int i = 0; model_families[i]; i++)
        if (strcmp(model_families[i]->name, name) == 0) return model_families[i];
    return NULL;
}

const model_family *family_of_preset(const char *name, const model_preset **preset) {
    for (int i = 0; model_families[i]; i++)
        for (int k = 0; k < model_families[i]->n_presets; k++)
            if (strcmp(model_families[i]->presets[k].name, name) == 0) {
                if (preset) *preset = &model_families[i]->presets[k];
                return model_families[i];
            }
    return NULL;
}

static int listed(const char *const *list, const char *s) {
    for (int i = 0; list && list[i]; i++)
        if (strcmp(list[i], s) == 0) return 1;
    return 0;
}

int family_of_hf(const cJSON *j, const char *path, const model_family **out, char *err,
                 size_t errlen) {
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    for (int i = 0; model_families[i]; i++) {
        const model_family *f = model_families[i];
        if (cJSON_IsString(a0) ? listed(f->hf_architectures, a0->valuestring)
                               : cJSON_IsString(mt) && listed(f->hf_model_types, mt->valuestring)) {
            *out = f;
            return 0;
        }
    }
    if (cJSON_IsString(a0))
        io_set_err(err, errlen, "%s: architecture \"%s\" is not one shardlm implements (%s)",
                   path, a0->valuestring, family_architectures());
    else if (cJSON_IsString(mt))
        io_set_err(err, errlen, "%s: model_type \"%s\" is not one shardlm implements (%s)", path,
                   mt->valuestring, family_architectures());
    else
        io_set_err(err, errlen, "%s: neither \"architectures\" nor \"model_type\" says what "
                   "model it is (shardlm implements %s)", path, family_architectures());
    return -1;
}

/* A space-separated list built once from the registry. */
static const char *joined(char *buf, size_t cap, int what) {
    if (buf[0]) return buf;
    size_t n = 0;
    for (int i = 0; model_families[i]; i++) {
        const model_family *f = model_families[i];
        if (what == 0) {
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? " " : "", f->name);
        } else if (what == 1) {
            for (int k = 0; k < f->n_presets; k++)
                n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? " " : "", f->presets[k].name);
        } else {
            for (int k = 0; f->hf_architectures[k]; k++)
                n += (size_t)snprintf(buf + n, cap - n, "%s%s (%s)", n ? ", " : "",
                                      f->hf_architectures[k], f->name);
        }
        if (n >= cap) n = cap - 1;
    }
    return buf;
}

const char *family_names(void) {
    static char buf[256];
    return joined(buf, sizeof buf, 0);
}
const char *family_preset_names(void) {
    static char buf[1024];
    return joined(buf, sizeof buf, 1);
}
const char *family_architectures(void) {
    static char buf[512];
    return joined(buf, sizeof buf, 2);
}

void family_shape_defaults(const model_family *f, model_shape *shape) {
    memset(shape, 0, sizeof *shape);
    shape->family = f;
    char why[256];
    for (int i = 0; i < f->n_keys; i++)
        if (f->keys[i].def) key_parse(&f->keys[i], f->keys[i].def, model_shape_data(shape), why,
                                      sizeof why);
}

int family_shape_from_hf(const char *dir, model_shape *shape, char *err, size_t errlen) {
    cJSON *j;
    char path[1100];
    if (hf_config_load(dir, &j, path, sizeof path, err, errlen) != 0) return -1;
    const model_family *f;
    int rc = family_of_hf(j, path, &f, err, errlen);
    if (rc == 0) {
        family_shape_defaults(f, shape);
        rc = f->hf_read(j, path, model_shape_data(shape), err, errlen);
    }
    cJSON_Delete(j);
    if (rc != 0) return -1;
    /* every key config.json holds was given; the rest keep their defaults */
    unsigned char set[256] = {0};
    for (int i = 0; i < f->n_keys && i < 256; i++) set[i] = f->hf_names[i] != NULL;
    f->derive(model_shape_data(shape), set);
    char why[512];
    if (model_shape_validate(shape, why, sizeof why) != 0) {
        io_set_err(err, errlen, "%s: %s", path, why);
        return -1;
    }
    return 0;
}
