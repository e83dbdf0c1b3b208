/* Hugging Face tokenizer.json byte-level BPE (tokenizer_hf.c). */
#ifndef SHLM_TOKENIZER_HF_H
#define SHLM_TOKENIZER_HF_H

#include <stddef.h>

#include "src/tokenizer/tokenizer_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills t->ops, t->impl, t->vocab_size and t->file from the tokenizer.json at path. */
int tokenizer_hf_open(tokenizer *t, const char *path, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
