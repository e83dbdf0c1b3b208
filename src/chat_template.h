/* Chat templates: a conversation (role, content messages) rendered as text the way a
 * model's Hugging Face chat template renders it, for the two template families shardlm
 * knows: ChatML (<|im_start|>role\n...<|im_end|>\n; SmolLM2, Qwen) and Llama-2 chat
 * ([INST] ... [/INST] with a <<SYS>> system block). Other templates (any Jinja program)
 * are refused by name rather than approximated.
 *
 * A template is picked by name ("chatml", "llama2") or recognised in a model's raw
 * chat_template (src/tokenizer.h, tokenizer_chat_template): ChatML when it writes both
 * <|im_start|> and <|im_end|>; Llama-2 when it writes [INST], [/INST] and <<SYS>>. A
 * ChatML template may open a conversation that has no system message with a default one
 * (SmolLM2's: "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, ...");
 * that text is read from the template's string literal, so it renders as transformers'
 * apply_chat_template does. Every function returns 0, or -1 with one line in err;
 * nothing prints or exits. */
#ifndef SHLM_CHAT_TEMPLATE_H
#define SHLM_CHAT_TEMPLATE_H

#include <stddef.h>

#include "src/tokenizer.h"

typedef enum chat_format { CHAT_CHATML = 0, CHAT_LLAMA2 = 1 } chat_format;

typedef struct chat_template {
    chat_format format;
    char *default_system; /* ChatML: the system message of a conversation that has none
                           * (malloc'd), NULL for none */
    char bos[64], eos[64];/* Llama-2: the bos and eos token strings it writes */
} chat_template;

typedef struct chat_message {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
} chat_message;

/* The template called name ("chatml" or "llama2"; Llama-2's bos/eos "<s>", "</s>"). */
int chat_template_named(chat_template *t, const char *name, char *err, size_t errlen);
/* The template a model's raw chat_template text is (bos and eos: the tokenizer's token
 * strings, for Llama-2); where names the file it came from, for messages. */
int chat_template_recognise(chat_template *t, const char *text, const char *bos,
                            const char *eos, const char *where, char *err, size_t errlen);
/* The tokenizer's template (tokenizer_chat_template, its bos and eos strings), or the one
 * called name when name is not NULL or "auto". */
int chat_template_for(chat_template *t, const tokenizer *tok, const char *name, char *err,
                      size_t errlen);
void chat_template_free(chat_template *t);

/* Appends messages[0, n) rendered to out, then, with add_generation_prompt, what opens
 * the assistant's reply (ChatML: "<|im_start|>assistant\n"; Llama-2 writes nothing).
 * Roles: system (first only), user, assistant; Llama-2 also requires user and assistant
 * to alternate, starting with user, as its template does. */
int chat_render(const chat_template *t, const chat_message *messages, int n,
                int add_generation_prompt, byte_buf *out, char *err, size_t errlen);

/* The ids of rendered text as transformers' apply_chat_template(tokenize=True) gives them:
 * no bos or eos added (the template writes its own); the template's special strings
 * (ChatML's <|im_start|> and <|im_end|>, Llama-2's bos and eos) become their token ids.
 * A tokenizer.json tokenizer finds them in the text itself; for SentencePiece, which
 * would spell them as text, the text is cut at them and each piece encoded alone, as
 * transformers' Llama tokenizer does. */
int chat_encode(const chat_template *t, tokenizer *tok, const char *text, size_t len,
                token_ids *out, char *err, size_t errlen);

#endif
