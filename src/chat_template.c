/* ChatML and Llama-2 chat templates: recognising a model's template by its text, and
 * rendering a conversation into pieces with its assistant turns trained (chat_template.h). */
#include "src/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/errmsg.h"
#include "src/utf8.h"

/* The recognised texts, with \n as a newline. SmolLM2's (and Qwen1.5's) ChatML is the
 * plain one with CHATML_SYS_A + prompt + CHATML_SYS_B inserted after CHATML_HEAD. */
#define CHATML_HEAD "{% for message in messages %}"
#define CHATML_SYS_A "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
#define CHATML_SYS_B "<|im_end|>\n' }}{% endif %}"
#define CHATML_BODY                                                                            \
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"  \
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
static const char llama2_text[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}";

/* The template with its \n escapes as newlines and the white space around it trimmed
 * (malloc'd). Sound for telling the known texts apart: they hold no other backslash. */
static char *canonical(const char *t) {
    while (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r') t++;
    size_t n = strlen(t);
    while (n > 0 && (t[n - 1] == ' ' || t[n - 1] == '\t' || t[n - 1] == '\n' || t[n - 1] == '\r'))
        n--;
    char *out = malloc(n + 1);
    if (!out) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == '\\' && i + 1 < n && t[i + 1] == 'n') out[k++] = '\n', i++;
        else out[k++] = t[i];
    }
    out[k] = '\0';
    return out;
}

/* 1 when s starts with prefix (advancing *s past it). */
static int eat(const char **s, const char *prefix) {
    size_t n = strlen(prefix);
    if (strncmp(*s, prefix, n) != 0) return 0;
    *s += n;
    return 1;
}

/* Recognises canonical text t: the kind, and for ChatML its default system prompt
 * (malloc'd into *system, NULL for none). 0 when t is none of the known texts. */
static token_file_template recognise(const char *t, char **system) {
    *system = NULL;
    if (strcmp(t, llama2_text) == 0) return TOKEN_TEMPLATE_LLAMA2;
    const char *s = t;
    if (!eat(&s, CHATML_HEAD)) return TOKEN_TEMPLATE_NONE;
    if (strcmp(s, CHATML_BODY) == 0) return TOKEN_TEMPLATE_CHATML;
    if (!eat(&s, CHATML_SYS_A)) return TOKEN_TEMPLATE_NONE;
    const char *end = strstr(s, CHATML_SYS_B);
    if (!end || strcmp(end + strlen(CHATML_SYS_B), CHATML_BODY) != 0) return TOKEN_TEMPLATE_NONE;
    for (const char *c = s; c < end; c++)
        if (*c == '\'' || *c == '\\' || *c == '{' || *c == '}') return TOKEN_TEMPLATE_NONE;
    *system = strndup(s, (size_t)(end - s));
    return *system ? TOKEN_TEMPLATE_CHATML : TOKEN_TEMPLATE_NONE;
}

/* The ids of the template's two special tokens; -1 with err when tok lacks one. */
static int find_tokens(chat_template *ct, const tokenizer *tok, char *err, size_t errlen) {
    if (ct->kind == TOKEN_TEMPLATE_CHATML) {
        ct->open_id = tokenizer_token_id(tok, "<|im_start|>");
        ct->close_id = tokenizer_token_id(tok, "<|im_end|>");
    } else {
        ct->open_id = tokenizer_bos(tok);
        ct->close_id = tokenizer_eos(tok);
    }
    ct->open_text = ct->open_id >= 0 ? tokenizer_token_string(tok, ct->open_id) : NULL;
    ct->close_text = ct->close_id >= 0 ? tokenizer_token_string(tok, ct->close_id) : NULL;
    if (!ct->open_text || !ct->close_text) {
        snprintf(err, errlen, "%s: the %s chat template needs %s, which this tokenizer lacks",
                 tokenizer_path(tok), ct->kind == TOKEN_TEMPLATE_CHATML ? "chatml" : "llama2",
                 ct->kind == TOKEN_TEMPLATE_CHATML ? "the tokens <|im_start|> and <|im_end|>"
                                                   : "a bos and an eos token");
        return -1;
    }
    return 0;
}

int chat_template_open(chat_template *ct, const char *name, const tokenizer *tok, char *err,
                       size_t errlen) {
    memset(ct, 0, sizeof *ct);
    if (strcmp(name, "chatml") == 0 || strcmp(name, "llama2") == 0) {
        ct->kind = name[0] == 'c' ? TOKEN_TEMPLATE_CHATML : TOKEN_TEMPLATE_LLAMA2;
        snprintf(ct->source, sizeof ct->source, "%s (built in)", name);
    } else if (strcmp(name, "auto") == 0) {
        const char *raw = tokenizer_chat_template(tok);
        if (!raw) return 1;
        const char *file = tokenizer_chat_template_path(tok);
        char *text = canonical(raw);
        if (!text) {
            snprintf(err, errlen, "%s: out of memory", file);
            return -1;
        }
        ct->kind = recognise(text, &ct->default_system);
        free(text);
        if (ct->kind == TOKEN_TEMPLATE_NONE) {
            snprintf(err, errlen, "%s: its chat_template is not one shardlm renders (the plain "
                     "and SmolLM2-style ChatML, Llama-2's [INST]): give --chat-template chatml "
                     "or llama2 to use one of those instead", file);
            return -1;
        }
        snprintf(ct->source, sizeof ct->source, "%s (%s%s)", file,
                 ct->kind == TOKEN_TEMPLATE_CHATML ? "chatml" : "llama2",
                 ct->default_system ? " with a default system prompt" : "");
    } else {
        snprintf(err, errlen, "unknown chat template '%s' (auto, chatml or llama2)", name);
        return -1;
    }
    if (find_tokens(ct, tok, err, errlen) != 0) {
        chat_template_free(ct);
        return -1;
    }
    return 0;
}

void chat_template_free(chat_template *ct) {
    free(ct->default_system);
    ct->default_system = NULL;
}

/* Python's str.isspace: general category Zs, or bidirectional class WS, B or S. */
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* s[0, *n) without the leading and trailing white space str.strip() removes; returns the
 * new start. Bytes that are not UTF-8 count as text. */
static const char *py_strip(const char *s, size_t *n) {
    const unsigned char *p = (const unsigned char *)s, *e = p + *n;
    while (p < e) {
        size_t k = utf8_valid_len(p, (size_t)(e - p));
        size_t len;
        if (!k || !py_space(utf8_decode(p, &len))) break;
        p += k;
    }
    while (e > p) { /* back to the start of the last character */
        const unsigned char *c = e - 1;
        while (c > p && (*c & 0xC0) == 0x80 && e - c < 4) c--;
        size_t len;
        if (utf8_valid_len(c, (size_t)(e - c)) != (size_t)(e - c) ||
            !py_space(utf8_decode(c, &len)))
            break;
        e = c;
    }
    *n = (size_t)(e - p);
    return (const char *)p;
}

int chat_text_is_blank(const char *s) {
    size_t n = strlen(s);
    py_strip(s, &n);
    return n == 0;
}

static int known_role(const char *r) {
    return strcmp(r, "system") == 0 || strcmp(r, "user") == 0 || strcmp(r, "assistant") == 0;
}

#define PUT(call)                                                                              \
    do {                                                                                       \
        if ((call) != 0) {                                                                     \
            snprintf(err, errlen, "out of memory rendering a conversation");                   \
            return -1;                                                                         \
        }                                                                                      \
    } while (0)

static int render_chatml(const chat_template *ct, const chat_message *msgs, int n, int gen,
                         doc_pieces *out, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        if (i == 0 && ct->default_system && strcmp(msgs[0].role, "system") != 0) {
            PUT(doc_pieces_token(out, ct->open_id, ct->open_text, 0));
            PUT(doc_pieces_text(out, "system\n", 7, 0));
            PUT(doc_pieces_text(out, ct->default_system, strlen(ct->default_system), 0));
            PUT(doc_pieces_token(out, ct->close_id, ct->close_text, 0));
            PUT(doc_pieces_text(out, "\n", 1, 0));
        }
        const int trained = strcmp(msgs[i].role, "assistant") == 0;
        PUT(doc_pieces_token(out, ct->open_id, ct->open_text, 0));
        PUT(doc_pieces_text(out, msgs[i].role, strlen(msgs[i].role), 0));
        PUT(doc_pieces_text(out, "\n", 1, 0));
        PUT(doc_pieces_text(out, msgs[i].content, strlen(msgs[i].content), trained));
        PUT(doc_pieces_token(out, ct->close_id, ct->close_text, trained));
        PUT(doc_pieces_text(out, "\n", 1, 0));
    }
    if (gen) {
        PUT(doc_pieces_token(out, ct->open_id, ct->open_text, 0));
        PUT(doc_pieces_text(out, "assistant\n", 10, 0));
    }
    return 0;
}

static int render_llama2(const chat_template *ct, const chat_message *msgs, int n,
                         doc_pieces *out, char *err, size_t errlen) {
    const char *system = n > 0 && strcmp(msgs[0].role, "system") == 0 ? msgs[0].content : NULL;
    const int first = system ? 1 : 0;
    byte_buf content = {0};
    int rc = 0;
    for (int i = first; rc == 0 && i < n; i++) {
        const int k = i - first, user = strcmp(msgs[i].role, "user") == 0;
        if (!user && strcmp(msgs[i].role, "assistant") != 0) {
            /* the Jinja template drops a system message at an odd place silently and
             * refuses one at an even place: refused wherever it is */
            snprintf(err, errlen, "message %d: a system message must be the first (llama2)",
                     i + 1);
            rc = -1;
            break;
        }
        if (user != (k % 2 == 0)) {
            snprintf(err, errlen, "message %d: roles must alternate user/assistant/user/... "
                     "after an optional system message (llama2), and this one is %s", i + 1,
                     msgs[i].role);
            rc = -1;
            break;
        }
        content.n = 0;
        if (k == 0 && system)
            rc |= byte_buf_append(&content, "<<SYS>>\n", 8) |
                  byte_buf_append(&content, system, strlen(system)) |
                  byte_buf_append(&content, "\n<</SYS>>\n\n", 11);
        rc |= byte_buf_append(&content, msgs[i].content, strlen(msgs[i].content));
        size_t len = content.n;
        const char *c = py_strip(content.data ? content.data : "", &len);
        if (user) {
            rc |= doc_pieces_token(out, ct->open_id, ct->open_text, 0) |
                  doc_pieces_text(out, "[INST] ", 7, 0) | doc_pieces_text(out, c, len, 0) |
                  doc_pieces_text(out, " [/INST]", 8, 0);
        } else {
            rc |= doc_pieces_text(out, " ", 1, 1) | doc_pieces_text(out, c, len, 1) |
                  doc_pieces_text(out, " ", 1, 1) |
                  doc_pieces_token(out, ct->close_id, ct->close_text, 1);
        }
        if (rc) snprintf(err, errlen, "out of memory rendering a conversation");
    }
    free(content.data);
    return rc ? -1 : 0;
}

int chat_render(const chat_template *ct, const chat_message *msgs, int n,
                int add_generation_prompt, doc_pieces *out, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        if (!known_role(msgs[i].role)) {
            io_set_err(err, errlen, "message %d: unknown role '%.40s' (system, user or "
                       "assistant)", i + 1, msgs[i].role);
            return -1;
        }
    if (ct->kind == TOKEN_TEMPLATE_CHATML)
        return render_chatml(ct, msgs, n, add_generation_prompt, out, err, errlen);
    return render_llama2(ct, msgs, n, out, err, errlen);
}
