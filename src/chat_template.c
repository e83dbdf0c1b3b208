/* Chat templates (see chat_template.h): ChatML and Llama-2 chat by name or recognised in a
 * model's template, rendered as their Hugging Face Jinja templates render them. */
#include "src/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/errmsg.h"
#include "src/utf8.h"

/* messages quote names and text from files: one line whatever they hold */
#define set_err io_set_err

static int copy_token(char *dst, size_t n, const char *src, const char *what, char *err,
                      size_t errlen) {
    if (!src || strlen(src) >= n) {
        set_err(err, errlen, "chat template llama2 needs the tokenizer's %s token string "
                "(%s)", what, src ? "too long" : "the tokenizer has none");
        return -1;
    }
    snprintf(dst, n, "%s", src);
    return 0;
}

int chat_template_named(chat_template *t, const char *name, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    if (strcmp(name, "chatml") == 0) {
        t->format = CHAT_CHATML;
        return 0;
    }
    if (strcmp(name, "llama2") == 0) {
        t->format = CHAT_LLAMA2;
        snprintf(t->bos, sizeof t->bos, "<s>");
        snprintf(t->eos, sizeof t->eos, "</s>");
        return 0;
    }
    set_err(err, errlen, "unknown chat template '%s' (known: chatml, llama2)", name);
    return -1;
}

/* The Jinja string literal that contains text[pos] ('...' or "..."), unescaped into a
 * malloc'd string; NULL when text[pos] is not inside one. */
static char *literal_around(const char *text, size_t pos) {
    size_t open = pos;
    while (open > 0 && text[open - 1] != '\'' && text[open - 1] != '"') open--;
    if (open == 0) return NULL;
    const char q = text[open - 1];
    char *out = malloc(strlen(text + open) + 1);
    if (!out) return NULL;
    size_t n = 0;
    for (const char *p = text + open; *p; p++) {
        if (*p == q) {
            out[n] = '\0';
            return out;
        }
        if (*p == '\\' && p[1]) { /* Jinja's escapes, Python's */
            p++;
            out[n++] = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'r' ? '\r' : *p;
        } else {
            out[n++] = *p;
        }
    }
    free(out);
    return NULL; /* no closing quote */
}

int chat_template_recognise(chat_template *t, const char *text, const char *bos,
                            const char *eos, const char *where, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    if (strstr(text, "<|im_start|>") && strstr(text, "<|im_end|>")) {
        t->format = CHAT_CHATML;
        /* a default system message: a literal "<|im_start|>system\n...<|im_end|>\n" */
        const char *sys = strstr(text, "<|im_start|>system");
        if (!sys) return 0;
        char *lit = literal_around(text, (size_t)(sys - text));
        static const char head[] = "<|im_start|>system\n", tail[] = "<|im_end|>\n";
        const size_t n = lit ? strlen(lit) : 0;
        if (lit && n >= sizeof head - 1 + sizeof tail - 1 && strncmp(lit, head, sizeof head - 1) == 0 &&
            strcmp(lit + n - (sizeof tail - 1), tail) == 0) {
            lit[n - (sizeof tail - 1)] = '\0';
            memmove(lit, lit + sizeof head - 1, strlen(lit + sizeof head - 1) + 1);
            t->default_system = lit;
            return 0;
        }
        free(lit);
        set_err(err, errlen, "%s: a ChatML chat template whose default system message is not "
                "one '<|im_start|>system\\n...<|im_end|>\\n' string: not one shardlm renders "
                "(give --chat-template chatml to use plain ChatML)", where);
        return -1;
    }
    if (strstr(text, "[INST]") && strstr(text, "[/INST]") && strstr(text, "<<SYS>>")) {
        t->format = CHAT_LLAMA2;
        if (copy_token(t->bos, sizeof t->bos, bos, "bos", err, errlen) != 0 ||
            copy_token(t->eos, sizeof t->eos, eos, "eos", err, errlen) != 0)
            return -1;
        return 0;
    }
    set_err(err, errlen, "%s: the chat template is neither ChatML nor Llama-2's [INST] format, "
            "the two shardlm renders (--chat-template chatml|llama2 picks one by name)", where);
    return -1;
}

int chat_template_for(chat_template *t, const tokenizer *tok, const char *name, char *err,
                      size_t errlen) {
    if (name && strcmp(name, "auto") != 0) {
        if (chat_template_named(t, name, err, errlen) != 0) return -1;
        if (t->format == CHAT_LLAMA2) { /* the model's own bos/eos strings where it has them */
            const char *b = tokenizer_token_string(tok, tokenizer_bos(tok));
            const char *e = tokenizer_token_string(tok, tokenizer_eos(tok));
            if (b) snprintf(t->bos, sizeof t->bos, "%s", b);
            if (e) snprintf(t->eos, sizeof t->eos, "%s", e);
        }
        return 0;
    }
    const char *text = tokenizer_chat_template(tok);
    if (!text) {
        set_err(err, errlen, "%s: the model has no chat template (tokenizer_config.json's "
                "chat_template, chat_template.jinja); --chat-template chatml|llama2 picks one",
                tokenizer_path(tok));
        return -1;
    }
    return chat_template_recognise(t, text, tokenizer_token_string(tok, tokenizer_bos(tok)),
                                   tokenizer_token_string(tok, tokenizer_eos(tok)),
                                   tokenizer_path(tok), err, errlen);
}

void chat_template_free(chat_template *t) {
    free(t->default_system);
    t->default_system = NULL;
}

/* ---------------------------------------------------------------- rendering */

/* Whether code point cp is whitespace as Python's str.isspace says (what the Llama-2
 * template's strip() removes). */
static int py_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 ||
           cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* s without leading and trailing whitespace: [*b, *e) (a malformed byte is no space). */
static void py_strip(const char *s, const char **b, const char **e) {
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    const unsigned char *first = NULL, *last_end = end;
    while (p < end) {
        size_t len = utf8_valid_len(p, (size_t)(end - p)), cp_len;
        const int space = len > 0 && py_space(utf8_decode(p, &cp_len));
        if (len == 0) len = 1;
        if (!space) {
            if (!first) first = p;
            last_end = p + len;
        }
        p += len;
    }
    *b = (const char *)(first ? first : end);
    *e = (const char *)(first ? last_end : end);
}

static int put(byte_buf *out, const char *s, size_t n, char *err, size_t errlen) {
    if (byte_buf_append(out, s, n) == 0) return 0;
    set_err(err, errlen, "chat template: out of memory");
    return -1;
}
#define PUTS(s) do { if (put(out, (s), strlen(s), err, errlen)) return -1; } while (0)

static int known_role(const char *r) {
    return !strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant");
}

static int render_chatml(const chat_template *t, const chat_message *m, int n, int gen,
                         byte_buf *out, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        if (i == 0 && strcmp(m[0].role, "system") != 0 && t->default_system) {
            PUTS("<|im_start|>system\n");
            PUTS(t->default_system);
            PUTS("<|im_end|>\n");
        }
        PUTS("<|im_start|>");
        PUTS(m[i].role);
        PUTS("\n");
        PUTS(m[i].content);
        PUTS("<|im_end|>\n");
    }
    if (gen) PUTS("<|im_start|>assistant\n");
    return 0;
}

static int render_llama2(const chat_template *t, const chat_message *m, int n, byte_buf *out,
                         char *err, size_t errlen) {
    const int has_system = n > 0 && strcmp(m[0].role, "system") == 0;
    const chat_message *loop = m + has_system;
    const int nl = n - has_system;
    for (int i = 0; i < nl; i++) {
        const int user = strcmp(loop[i].role, "user") == 0;
        if (user != (i % 2 == 0) || (!user && strcmp(loop[i].role, "assistant") != 0)) {
            set_err(err, errlen, "chat template llama2: message %d is '%s': after an optional "
                    "system message, roles must alternate user/assistant/user/...",
                    i + has_system + 1, loop[i].role);
            return -1;
        }
        /* the system message joins the first turn's content, and strip() applies to both */
        byte_buf content = {0};
        int rc = 0;
        if (i == 0 && has_system)
            rc = put(&content, "<<SYS>>\n", 8, err, errlen) ||
                 put(&content, m[0].content, strlen(m[0].content), err, errlen) ||
                 put(&content, "\n<</SYS>>\n\n", 11, err, errlen);
        if (!rc) rc = put(&content, loop[i].content, strlen(loop[i].content), err, errlen) ||
                      put(&content, "", 1, err, errlen);
        const char *b = "", *e = b;
        if (!rc) py_strip(content.data, &b, &e);
        if (!rc && user) {
            rc = put(out, t->bos, strlen(t->bos), err, errlen) ||
                 put(out, "[INST] ", 7, err, errlen) ||
                 put(out, b, (size_t)(e - b), err, errlen) ||
                 put(out, " [/INST]", 8, err, errlen);
        } else if (!rc) {
            rc = put(out, " ", 1, err, errlen) || put(out, b, (size_t)(e - b), err, errlen) ||
                 put(out, " ", 1, err, errlen) || put(out, t->eos, strlen(t->eos), err, errlen);
        }
        free(content.data);
        if (rc) return -1;
    }
    return 0;
}

int chat_render(const chat_template *t, const chat_message *m, int n,
                int add_generation_prompt, byte_buf *out, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        if (!m[i].role || !m[i].content || !known_role(m[i].role)) {
            set_err(err, errlen, "chat message %d: role '%s' (known: system, user, assistant)",
                    i + 1, m[i].role ? m[i].role : "(none)");
            return -1;
        }
        if (i > 0 && strcmp(m[i].role, "system") == 0) {
            set_err(err, errlen, "chat message %d: a system message comes first or not at all",
                    i + 1);
            return -1;
        }
    }
    if (t->format == CHAT_CHATML) return render_chatml(t, m, n, add_generation_prompt, out, err, errlen);
    return render_llama2(t, m, n, out, err, errlen);
}

int chat_encode(const chat_template *t, tokenizer *tok, const char *text, size_t len,
                token_ids *out, char *err, size_t errlen) {
    if (strcmp(tokenizer_kind(tok), "sentencepiece") != 0)
        return tokenizer_encode(tok, text, len, out, err, errlen);
    const char *chatml[2] = {"<|im_start|>", "<|im_end|>"}, *llama2[2] = {t->bos, t->eos};
    const char *const *special = t->format == CHAT_CHATML ? chatml : llama2;
    int32_t id[2];
    for (int k = 0; k < 2; k++) id[k] = tokenizer_token_id(tok, special[k]);
    const char *p = text, *end = text + len;
    while (p < end) {
        /* the nearest special string the tokenizer has as a token */
        const char *hit = NULL;
        int which = -1;
        for (int k = 0; k < 2; k++) {
            if (id[k] < 0 || !special[k][0]) continue;
            const char *h = memmem(p, (size_t)(end - p), special[k], strlen(special[k]));
            if (h && (!hit || h < hit)) hit = h, which = k;
        }
        const char *stop = hit ? hit : end;
        if (stop > p && tokenizer_encode(tok, p, (size_t)(stop - p), out, err, errlen) != 0)
            return -1;
        if (!hit) break;
        if (token_ids_push(out, id[which]) != 0) {
            set_err(err, errlen, "chat template: out of memory");
            return -1;
        }
        p = hit + strlen(special[which]);
    }
    return 0;
}
