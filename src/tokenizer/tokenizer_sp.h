/* SentencePiece models through libsentencepiece (tokenizer_sp.cc). */
#ifndef SHLM_TOKENIZER_SP_H
#define SHLM_TOKENIZER_SP_H

#include <stddef.h>

#include "src/tokenizer/tokenizer_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills t->ops, t->impl, t->vocab_size and t->file from the tokenizer.model at path. */
int tokenizer_sp_open(tokenizer *t, const char *path, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
