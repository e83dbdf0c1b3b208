/* A LoRA checkpoint's adapters folded into their frozen base (`shardlm ckpt export
 * --merged`): the base's Hugging Face directory recognised by the fingerprint the
 * checkpoint recorded, then each base tensor with its adapter merged as PEFT's
 * merge_and_unload merges it. */
#ifndef SHLM_LORA_EXPORT_H
#define SHLM_LORA_EXPORT_H

#include <stddef.h>

#include "io/ckpt_hdf5.h"
#include "src/ckpt/checkpoint.h"
#include "src/engine/model.h"

typedef struct lora_merge lora_merge;

/* Opens the merge of the adapters of checkpoint f (the file path, shape m, state st with
 * st->lora_rank > 0 and st->lora_alpha > 0) into the base in base_dir (a Hugging Face
 * directory). Rank 0 reads the base's weights, which must have m's tensors and shapes and
 * the fingerprint st->lora_base_fingerprint (fsdp_base_fingerprint's, of the values as
 * read or as their bf16 rounding: the two ways a run stores its base, fsdp.param_dtype),
 * and keeps every adapter tensor, each checked against its checksum. Collective over the
 * world; 0, or -1 with one line in err on every rank (a different base names both
 * fingerprints). */
int lora_merge_open(lora_merge **out, ckpt_h5_file *f, const char *path, const model_shape *m,
                    const ckpt_state *st, const char *base_dir, char *err, size_t errlen);

/* Rank 0: base tensor t (of model_shape_desc_open(m)'s layout) into out (t->numel fp32),
 * merged where an adapter targets it, in fp32:
 *   W' = W + s·B·A                                 s = alpha / r (alpha / √r with rslora)
 *   DoRA: W' = m ⊙ (W + s·B·A) / ||W + s·B·A||    the L2 norm of each row, one per output
 * and read as it is where none does. 0, or -1 with err. Local. */
int lora_merge_tensor(lora_merge *lm, const model_tensor *t, float *out, char *err,
                      size_t errlen);

/* Frees what lora_merge_open made (NULL is fine). Local. */
void lora_merge_close(lora_merge *lm);

#endif
