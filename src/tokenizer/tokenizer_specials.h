/* Special tokens as transformers resolves them (tokenizer_specials.c: the precedence). */
#ifndef SHLM_TOKENIZER_SPECIALS_H
#define SHLM_TOKENIZER_SPECIALS_H

#include <stddef.h>

#include "src/tokenizer/tokenizer_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills bos, eos_ids, pad, add_bos, add_eos and chat_template from t->file and the model
 * directory t->dir. */
int tokenizer_specials_resolve(tokenizer *t, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
