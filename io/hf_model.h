/* Hugging Face model directories: config.json of a Llama (read and write) and the
 * weights in model.safetensors or in shards listed by model.safetensors.index.json. */
#ifndef SHLM_HF_MODEL_H
#define SHLM_HF_MODEL_H

/*
 * Only what a LlamaForCausalLM needs is read; anything that would change the
 * arithmetic and that shardlm does not implement (rope_scaling, attention or MLP
 * biases, an activation other than SiLU) is refused with a message rather than
 * silently ignored. Every function returns 0, or -1 with one line naming the file in
 * err; nothing here prints or exits.
 */

#include <stddef.h>

#include "io/safetensors.h"

typedef struct hf_config {
    int hidden_size;             /* d */
    int num_hidden_layers;       /* L */
    int num_attention_heads;
    int num_key_value_heads;     /* default: num_attention_heads */
    int head_dim;                /* default: hidden_size / num_attention_heads */
    int intermediate_size;       /* F */
    int vocab_size;
    int max_position_embeddings; /* default 2048 */
    double rms_norm_eps;         /* default 1e-6 (transformers' LlamaConfig) */
    double rope_theta;           /* top level or rope_parameters.rope_theta; default 10000 */
    int tie_word_embeddings;     /* lm_head shares model.embed_tokens.weight */
} hf_config;

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

/* Reads DIR/config.json. */
int hf_config_read(const char *dir, hf_config *c, char *err, size_t errlen);
/* Writes DIR/config.json for LlamaForCausalLM (torch_dtype e.g. "float32"), through a
 * temporary file renamed into place. base (may be NULL): the text of a JSON object whose
 * members are kept (a source model's config.json: its token ids and whatever else
 * transformers reads), with the architecture, the dtype and the fields shardlm refuses
 * otherwise written over them (rope_theta inside rope_parameters when base keeps it there;
 * "dtype" as well as torch_dtype when base has it, as newer transformers write). */
int hf_config_write(const char *dir, const hf_config *c, const char *torch_dtype,
                    const char *base, char *err, size_t errlen);

/* The weights of a directory: one safetensors file or the shards of an index. */
typedef struct hf_weights {
    char dir[1024];
    int n_files;
    safetensors_file *files;
} hf_weights;

/* Opens DIR/model.safetensors.index.json's shards if the index exists, else
 * DIR/model.safetensors. Reads headers only. */
int hf_weights_open(hf_weights *w, const char *dir, char *err, size_t errlen);
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
