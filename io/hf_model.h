/* Hugging Face model directories: config.json as a JSON object (read, typed members with
 * one-line errors, written back) and the weights in model.safetensors or in shards listed
 * by model.safetensors.index.json. What config.json's members mean belongs to a model
 * family (src/model/family.h): this layer knows files, not architectures. Every function
 * returns 0, or -1 with one line naming the file in err; nothing here prints or exits. */
#ifndef SHLM_HF_MODEL_H
#define SHLM_HF_MODEL_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "io/safetensors.h"

/* What a model source path is (model.init_from, generate/eval --ckpt). Local. */
typedef enum hf_source {
    HF_SOURCE_HF_DIR = 1,     /* a directory with config.json and its safetensors weights */
    HF_SOURCE_CHECKPOINT = 2, /* a shardlm checkpoint: an HDF5 file, or a directory with a
                               * `latest` (src/ckpt/checkpoint.h resolves it) */
} hf_source;
/* The kind of path, or -1 with one line naming what it is instead and what is expected:
 * nothing there, a directory with neither config.json nor `latest`, a config.json with no
 * weights beside it, a bare .safetensors file (its directory is the model), a GGUF file
 * (llama.cpp's format), any other file. */
int hf_source_kind(const char *path, char *err, size_t errlen);

/* Reads DIR/config.json into *out (a JSON object; cJSON_Delete it), its path into path. */
int hf_config_load(const char *dir, cJSON **out, char *path, size_t pathlen, char *err,
                   size_t errlen);
/* The same for any JSON object file at path (adapter_config.json). */
int hf_json_load(const char *path, cJSON **out, char *err, size_t errlen);
/* Writes j (deleted here whatever happens) indented as DIR/name, with a final newline,
 * through a temporary file renamed into place. */
int hf_json_save(cJSON *j, const char *dir, const char *name, char *err, size_t errlen);
/* Writes j (deleted here whatever happens) as DIR/config.json through a temporary file
 * renamed into place, with torch_dtype (e.g. "float32"; "dtype" too where j has it, as
 * newer transformers write). */
int hf_config_save(const char *dir, cJSON *j, const char *torch_dtype, char *err,
                   size_t errlen);
/* Typed members of a config.json object o read from path. An integer member: absent or
 * null -> def, or an error when def < 0 (required); must be a non-negative integer. */
int hf_json_int(const cJSON *o, const char *key, int def, int *out, const char *path,
                char *err, size_t errlen);
/* A positive finite number; absent or null -> def. */
int hf_json_double(const cJSON *o, const char *key, double def, double *out, const char *path,
                   char *err, size_t errlen);
/* true/false; absent or null -> 0; anything else ("true" as a string, 1) is an error rather
 * than silently false. */
int hf_json_bool(const cJSON *o, const char *key, int *out, const char *path, char *err,
                 size_t errlen);
/* Sets member key of object j to item (replacing one there). */
void hf_json_put(cJSON *j, const char *key, cJSON *item);
/* The shortest decimal that reads back as the float v is (shardlm keeps rms_norm_eps and
 * rope_theta as floats): 1e-05 rather than 9.99999974737875e-06. */
double hf_float_decimal(double v);
/* A JSON number of the float v as Python's json writes a float: hf_float_decimal's digits,
 * with ".0" where they hold neither a point nor an exponent (8.0, not 8: transformers
 * warns when a RoPE factor is not a float). */
cJSON *hf_json_float(double v);

/* The weights of a directory: one safetensors file or the shards of an index. */
typedef struct hf_weights {
    char dir[1024];
    int n_files;
    safetensors_file *files;
} hf_weights;

/* Opens DIR/model.safetensors.index.json's shards if the index exists, else
 * DIR/model.safetensors. Reads headers only. */
int hf_weights_open(hf_weights *w, const char *dir, char *err, size_t errlen);
/* Opens the one safetensors file DIR/name (a PEFT adapter's adapter_model.safetensors). */
int hf_weights_open_file(hf_weights *w, const char *dir, const char *name, char *err,
                         size_t errlen);
void hf_weights_close(hf_weights *w);
/* The tensor called name and its file, or -1 (err names the directory). */
int hf_weights_find(hf_weights *w, const char *name, safetensors_file **file,
                    const safetensors_tensor **t, char *err, size_t errlen);

/* Writes DIR/model.safetensors.index.json: n tensors, tensor i in file files[i]
 * (a name relative to DIR), total_size the data bytes of all shards. */
int hf_index_write(const char *dir, int n, const char *const *names,
                   const char *const *files, unsigned long long total_size, char *err,
                   size_t errlen);

#endif
