/* Chat templates: a conversation (role, content messages) rendered the way a model's
 * Hugging Face chat template renders it, for the template families shardlm knows, ChatML
 * (plain, or with a default system prompt: SmolLM2's, Qwen2.5's), Llama-2 chat and
 * Llama-3.1's;
 * any other template (any Jinja program) is refused, not approximated. One renderer serves `data prepare` (the rendering as pieces with the
 * assistant turns marked trained, src/data/doc_pieces.h) and `generate --chat` (the prompt's
 * ids), so training and inference see the same text.
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
 *           template ends with [/INST]). <s>, </s>: the tokenizer's bos and eos strings.
 *   llama3  Llama-3.1's (its template without tools, its date_string left at the default):
 *           <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting
 *           Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|>, S the
 *           first message's content stripped when it is a system message (then not
 *           rendered again), else empty; then for each message
 *           <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>, CONTENT stripped
 *           as str.strip does; add_generation_prompt:
 *           <|start_header_id|>assistant<|end_header_id|>\n\n. Trained: an assistant's
 *           CONTENT<|eot_id|>.
 *
 * A model's own template is recognised by its text (chat_template_recognise says how).
 * The template's two special strings (chatml: <|im_start|>, <|im_end|>; llama2: bos, eos;
 * llama3: <|start_header_id|>, <|eot_id|>) are their token ids wherever they stand in the rendered text, as transformers'
 * tokenizers match added tokens in text: also inside a message. Every function returns 0,
 * or -1 with one line in err; nothing prints or exits. */
#ifndef SHLM_CHAT_TEMPLATE_H
#define SHLM_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "src/data/doc_pieces.h"
#include "src/tokenizer/tokenizer.h"

typedef enum chat_format { CHAT_CHATML = 0, CHAT_LLAMA2 = 1, CHAT_LLAMA3 = 2 } chat_format;

typedef struct chat_template {
    chat_format format;
    char *default_system;   /* chatml: the system message of a conversation that has none
                             * (malloc'd), NULL for none */
    char bos[64], eos[64];  /* llama2: the bos and eos token strings it writes; llama3:
                             * the bos (eos unused) */
    int32_t open_id, close_id; /* the two special strings' ids in the tokenizer given to
                                * chat_template_for, -1 where it has none (or none given) */
    char source[1200];      /* what it is and where it came from, for messages */
} chat_template;

typedef struct chat_message {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
} chat_message;

/* The template called name ("chatml": no default system prompt; "qwen2.5": ChatML with
 * Qwen's, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", as
 * Qwen2.5's template renders a conversation without tools; "llama2": bos/eos "<s>",
 * "</s>"; "llama3": Llama-3.1's, bos "<|begin_of_text|>"). */
int chat_template_named(chat_template *t, const char *name, char *err, size_t errlen);
/* The template a model's raw chat_template text is: after its \n escapes are read as
 * newlines and the white space around it is trimmed, the text must be transformers' plain
 * ChatML template, SmolLM2's (the plain one with a default system prompt inserted when the
 * first message is not a system one: any prompt text without quotes, backslashes or
 * braces; Qwen1.5's and Qwen2's are written the same way), Qwen2.5's (with its tool-call
 * branches; ChatML with Qwen's default system prompt, as "qwen2.5" renders), Meta's
 * Llama-2-chat template, or Meta's Llama-3.1 template (with its tool branches; "llama3"
 * renders it without tools; Llama-3.2's, which writes the day's date, is not it). bos and
 * eos:
 * the tokenizer's token strings (llama2); where names the file, for messages. */
int chat_template_recognise(chat_template *t, const char *text, const char *bos,
                            const char *eos, const char *where, char *err, size_t errlen);
/* The tokenizer's template (tokenizer_chat_template, recognised; its bos and eos), or the
 * one called name when name is neither NULL nor "auto"; the special strings' ids are
 * looked up in tok. */
int chat_template_for(chat_template *t, const tokenizer *tok, const char *name, char *err,
                      size_t errlen);
void chat_template_free(chat_template *t);

/* Appends the rendering of messages[0, n) to out as pieces (the header comment says what
 * is trained); with add_generation_prompt, what opens the assistant's reply. Roles:
 * system, user, assistant; llama2 also takes a system message first only and user and
 * assistant alternating, starting with user, as its template raises otherwise. */
int chat_render_pieces(const chat_template *t, const chat_message *messages, int n,
                       int add_generation_prompt, doc_pieces *out, char *err, size_t errlen);
/* The same rendering as text, appended to out. */
int chat_render(const chat_template *t, const chat_message *messages, int n,
                int add_generation_prompt, byte_buf *out, char *err, size_t errlen);

/* 1 when s (NUL-terminated UTF-8) is empty or only white space, as Python's str.isspace
 * has it (the white space llama2's strip() removes). */
int chat_text_is_blank(const char *s);

#endif
