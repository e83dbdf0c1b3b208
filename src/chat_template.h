/* Chat templates, rendered in C exactly as transformers' apply_chat_template renders the
 * Jinja templates they stand for: ChatML (the plain one, and SmolLM2's and Qwen1.5's with a
 * default system prompt) and Llama-2's [INST] format. A model's own template is recognised
 * by its text (chat_template_open's comment says how); any other is refused, since
 * shardlm runs no Jinja. The rendered conversation is a doc_pieces (src/doc_pieces.h):
 * the text transformers renders, its special tokens as ids, and the assistant turns marked
 * trained (their content and the end-of-turn token).
 *
 *   chatml  for each message: <|im_start|>ROLE\nCONTENT<|im_end|>\n ; with a default
 *           system prompt S and a first message that is not a system one, first
 *           <|im_start|>system\nS<|im_end|>\n ; add_generation_prompt: <|im_start|>assistant\n.
 *           Trained: an assistant's CONTENT<|im_end|> (not the \n after it).
 *   llama2  an optional first system message S; then user/assistant alternating, starting
 *           with user: user = <s>[INST] U [/INST], where U is the content (the first one
 *           prefixed with <<SYS>>\nS\n<</SYS>>\n\n) stripped of white space as Python's
 *           str.strip does; assistant = " " + content.strip() + " " + </s>. Trained: the
 *           assistant's " CONTENT " and </s>. add_generation_prompt adds nothing (the
 *           template ends with [/INST]). <s>, </s>: the tokenizer's bos and eos.
 */
#ifndef SHLM_CHAT_TEMPLATE_H
#define SHLM_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokens.h"
#include "src/doc_pieces.h"
#include "src/tokenizer.h"

typedef struct chat_template {
    token_file_template kind; /* TOKEN_TEMPLATE_CHATML or TOKEN_TEMPLATE_LLAMA2 */
    char *default_system;     /* chatml: the default system prompt, or NULL for none */
    char source[1200];        /* what it is and where it came from, for messages */
    /* chatml: <|im_start|> and <|im_end|>; llama2: bos and eos; ids and strings */
    int32_t open_id, close_id;
    const char *open_text, *close_text;
} chat_template;

/* One message: NUL-terminated role ("system", "user" or "assistant") and content. */
typedef struct chat_message {
    const char *role, *content;
} chat_message;

/* Picks the template `name` for tokenizer tok:
 *   chatml, llama2  the built-in template of that name (chatml: no default system prompt)
 *   auto            the tokenizer's own chat template (tokenizer_chat_template), when it is,
 *                   after its \n escapes are read as newlines and the white space around
 *                   it is trimmed, the text of transformers' plain ChatML template, of
 *                   SmolLM2's (ChatML with a default system prompt, any text without
 *                   quotes, backslashes or braces), or of Meta's Llama-2-chat template
 * The template's special tokens must be tokens of tok. Returns 0; 1 for auto when the
 * tokenizer has no template (ct untouched); -1 with one line in err (another template,
 * naming its file; an unknown name; a missing special token). */
int chat_template_open(chat_template *ct, const char *name, const tokenizer *tok, char *err,
                       size_t errlen);
void chat_template_free(chat_template *ct);

/* Appends the rendering of n messages to out (see the header comment); -1 with one line in
 * err for an unknown role, a llama2 conversation whose roles do not alternate
 * user/assistant (or a system message that is not the first), or no memory. */
int chat_render(const chat_template *ct, const chat_message *msgs, int n,
                int add_generation_prompt, doc_pieces *out, char *err, size_t errlen);

/* 1 when s (NUL-terminated UTF-8) is empty or only white space, as Python's str.isspace
 * has it (the white space llama2's strip() removes). */
int chat_text_is_blank(const char *s);

#endif
