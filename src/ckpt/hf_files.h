/* The Hugging Face files a checkpoint keeps beside its tensors, so that it exports on its
 * own (src/cli/cmd_ckpt.c) as a directory AutoTokenizer and AutoModelForCausalLM load as they
 * loaded the source: the model's config.json and generation_config.json, and the
 * tokenizer's files. A save stores them in the checkpoint (the /hf group, src/ckpt/save.c). */
#ifndef SHLM_HF_FILES_H
#define SHLM_HF_FILES_H

#include <stddef.h>

#include <mpi.h>

#include "src/tokenizer/tokenizer.h"

enum { HF_FILES_MAX = 8 };

typedef struct hf_file {
    char name[32]; /* one of hf_files_known's */
    char *data;    /* size bytes, NUL-terminated */
    size_t size;
} hf_file;

typedef struct hf_files {
    int n;
    hf_file f[HF_FILES_MAX];
} hf_files;

/* 1 when name is a file kept: config.json, generation_config.json, tokenizer.json,
 * tokenizer.model, tokenizer_config.json, special_tokens_map.json, chat_template.jinja,
 * added_tokens.json. */
int hf_files_known(const char *name);

/* Adds a copy of data under name, unless b holds name already (0 then too); -1 with err
 * when name is not known or memory runs out. */
int hf_files_add(hf_files *b, const char *name, const void *data, size_t size, char *err,
                 size_t errlen);
/* The file called name, or NULL. */
const hf_file *hf_files_get(const hf_files *b, const char *name);

/* Reads what b lacks: config.json and generation_config.json of model_dir (a Hugging
 * Face directory; NULL or "" for none); the tokenizer's file (tokenizer_path, kept as
 * tokenizer.model or tokenizer.json after its kind) and the other tokenizer files of its
 * directory, and that directory's generation_config.json when model_dir has none. The
 * byte tokenizer has no files. Local; -1 with err (naming the file) when one there cannot
 * be read. */
int hf_files_collect(hf_files *b, const char *model_dir, const tokenizer *tok, char *err,
                     size_t errlen);

/* Gives every rank of comm root's files (b's previous contents on the others are freed). */
void hf_files_bcast(hf_files *b, int root, MPI_Comm comm);
void hf_files_free(hf_files *b);

#endif
