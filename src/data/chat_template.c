/* Chat templates (see chat_template.h): ChatML, Llama-2 chat and Llama-3.1's by name or
 * recognised in a model's template, rendered as their Hugging Face Jinja templates render them, into
 * pieces with the assistant turns marked trained. */
#include "src/data/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/errmsg.h"
#include "src/base/utf8.h"

/* messages quote names and text from files: one line whatever they hold */
#define set_err io_set_err

/* The recognised texts, with \n as a newline. SmolLM2's (and Qwen1.5's) ChatML is the
 * plain one with CHATML_SYS_A + prompt + CHATML_SYS_B inserted after CHATML_HEAD. */
#define CHATML_HEAD "{% for message in messages %}"
#define CHATML_SYS_A                                                                           \
    "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
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
/* Qwen2.5's template (tokenizer_config.json's chat_template of Qwen2.5 and its -Instruct
 * models), as canonical() makes it. Without tools it is ChatML with QWEN_SYSTEM as the
 * default system prompt: its system, user and assistant messages (an assistant's without
 * tool calls, which shardlm's messages never have) render as ChatML's; tools, tool calls
 * and the tool role, which shardlm does not render, are refused as unknown roles. */
static const char qwen25_text[] =
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\n"
    "' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful"
    " assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\n"
    "\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\n"
    "\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\n"
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments"
    " within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    "{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n"
    "\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\n"
    "' + messages[0]['content'] + '<|im_end|>\n"
    "' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\n"
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not"
    " loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\n"
    "' + message.content + '<|im_end|>' + '\n"
    "' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\n"
    "' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\n"
    "<tool_call>\n"
    "{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\n"
    "</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\n"
    "' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\")"
    " %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\n"
    "<tool_response>\n"
    "' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\n"
    "</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\n"
    "' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\n"
    "' }}\n"
    "{%- endif %}";
#define QWEN_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
/* Llama-3.1's template (tokenizer_config.json's chat_template of Llama-3.1-8B-Instruct), as
 * canonical() makes it. Without tools (and custom_tools, builtin_tools, date_string, which
 * shardlm never passes) it is the llama3 rendering of chat_template.h. */
static const char llama31_text[] =
    "{{- bos_token }}\n"
    "{%- if custom_tools is defined %}\n"
    "    {%- set tools = custom_tools %}\n"
    "{%- endif %}\n"
    "{%- if not tools_in_user_message is defined %}\n"
    "    {%- set tools_in_user_message = true %}\n"
    "{%- endif %}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- set date_string = \"26 Jul 2024\" %}\n"
    "{%- endif %}\n"
    "{%- if not tools is defined %}\n"
    "    {%- set tools = none %}\n"
    "{%- endif %}\n"
    "\n"
    "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "\n"
    "{#- System message + builtin tools #}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\n"
    "\n"
    "\" }}\n"
    "{%- if builtin_tools is defined or tools is not none %}\n"
    "    {{- \"Environment: ipython\n"
    "\" }}\n"
    "{%- endif %}\n"
    "{%- if builtin_tools is defined %}\n"
    "    {{- \"Tools: \" + builtin_tools | reject('equalto',"
    " 'code_interpreter') | join(\", \") + \"\n"
    "\n"
    "\"}}\n"
    "{%- endif %}\n"
    "{{- \"Cutting Knowledge Date: December 2023\n"
    "\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\n"
    "\n"
    "\" }}\n"
    "{%- if tools is not none and not tools_in_user_message %}\n"
    "    {{- \"You have access to the following functions. To call"
    " a function, please respond with JSON for a function call.\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\":"
    " dictionary of argument name and its value}.' }}\n"
    "    {{- \"Do not use variables.\n"
    "\n"
    "\" }}\n"
    "    {%- for t in tools %}\n"
    "        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\n"
    "\n"
    "\" }}\n"
    "    {%- endfor %}\n"
    "{%- endif %}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "\n"
    "{#- Custom tools are passed in a user message with some extra guidance #}\n"
    "{%- if tools_in_user_message and not tools is none %}\n"
    "    {#- Extract the first user message so we can plug it in here #}\n"
    "    {%- if messages | length != 0 %}\n"
    "        {%- set first_user_message = messages[0]['content']|trim %}\n"
    "        {%- set messages = messages[1:] %}\n"
    "    {%- else %}\n"
    "        {{- raise_exception(\"Cannot put tools in the first user"
    " message when there's no first user message!\") }}\n"
    "{%- endif %}\n"
    "    {{- '<|start_header_id|>user<|end_header_id|>\n"
    "\n"
    "' -}}\n"
    "    {{- \"Given the following functions, please respond with a JSON"
    " for a function call \" }}\n"
    "    {{- \"with its proper arguments that best answers the given prompt.\n"
    "\n"
    "\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\":"
    " dictionary of argument name and its value}.' }}\n"
    "    {{- \"Do not use variables.\n"
    "\n"
    "\" }}\n"
    "    {%- for t in tools %}\n"
    "        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\n"
    "\n"
    "\" }}\n"
    "    {%- endfor %}\n"
    "    {{- first_user_message + \"<|eot_id|>\"}}\n"
    "{%- endif %}\n"
    "\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'ipython' or message.role == 'tool'"
    " or 'tool_calls' in message) %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n"
    "\n"
    "'+ message['content'] | trim + '<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n"
    "        {%- if not message.tool_calls|length == 1 %}\n"
    "            {{- raise_exception(\"This model only supports single"
    " tool-calls at once!\") }}\n"
    "        {%- endif %}\n"
    "        {%- set tool_call = message.tool_calls[0].function %}\n"
    "        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\n"
    "\n"
    "' -}}\n"
    "            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n"
    "            {%- for arg_name, arg_val in tool_call.arguments | items %}\n"
    "                {{- arg_name + '=\"' + arg_val + '\"' }}\n"
    "                {%- if not loop.last %}\n"
    "                    {{- \", \" }}\n"
    "                {%- endif %}\n"
    "                {%- endfor %}\n"
    "            {{- \")\" }}\n"
    "        {%- else  %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\n"
    "\n"
    "' -}}\n"
    "            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
    "            {{- '\"parameters\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- \"}\" }}\n"
    "        {%- endif %}\n"
    "        {%- if builtin_tools is defined %}\n"
    "            {#- This means we're in ipython mode #}\n"
    "            {{- \"<|eom_id|>\" }}\n"
    "        {%- else %}\n"
    "            {{- \"<|eot_id|>\" }}\n"
    "        {%- endif %}\n"
    "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
    "        {{- \"<|start_header_id|>ipython<|end_header_id|>\n"
    "\n"
    "\" }}\n"
    "        {%- if message.content is mapping or message.content is iterable %}\n"
    "            {{- message.content | tojson }}\n"
    "        {%- else %}\n"
    "            {{- message.content }}\n"
    "        {%- endif %}\n"
    "        {{- \"<|eot_id|>\" }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\n"
    "\n"
    "' }}\n"
    "{%- endif %}";
#define LLAMA3_BOS "<|begin_of_text|>"
#define LLAMA3_SYSTEM_HEAD "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"

int chat_template_named(chat_template *t, const char *name, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    t->open_id = t->close_id = -1;
    if (strcmp(name, "chatml") == 0) {
        t->format = CHAT_CHATML;
    } else if (strcmp(name, "qwen2.5") == 0) {
        t->format = CHAT_CHATML;
        t->default_system = strdup(QWEN_SYSTEM);
        if (!t->default_system) {
            set_err(err, errlen, "out of memory");
            return -1;
        }
    } else if (strcmp(name, "llama2") == 0) {
        t->format = CHAT_LLAMA2;
        snprintf(t->bos, sizeof t->bos, "<s>");
        snprintf(t->eos, sizeof t->eos, "</s>");
    } else if (strcmp(name, "llama3") == 0) {
        t->format = CHAT_LLAMA3;
        snprintf(t->bos, sizeof t->bos, LLAMA3_BOS);
    } else {
        set_err(err, errlen, "unknown chat template '%s' (known: chatml, llama2, llama3, "
                "qwen2.5)", name);
        return -1;
    }
    snprintf(t->source, sizeof t->source, "%s (built in)", name);
    return 0;
}

/* The template with its \n escapes as newlines and the white space around it trimmed
 * (malloc'd). Sound for telling the known texts apart: they hold no other backslash. */
static char *canonical(const char *text) {
    while (*text == ' ' || *text == '\t' || *text == '\n' || *text == '\r') text++;
    size_t n = strlen(text);
    while (n > 0 && strchr(" \t\n\r", text[n - 1])) n--;
    char *out = malloc(n + 1);
    if (!out) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\\' && i + 1 < n && text[i + 1] == 'n') out[k++] = '\n', i++;
        else out[k++] = text[i];
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

/* Which known text canonical text c is: 0 chatml (its default system prompt malloc'd into
 * *system, NULL for none), 1 llama2, 2 llama3, -1 none. */
static int known_text(const char *c, char **system) {
    *system = NULL;
    if (strcmp(c, llama2_text) == 0) return CHAT_LLAMA2;
    if (strcmp(c, llama31_text) == 0) return CHAT_LLAMA3;
    if (strcmp(c, qwen25_text) == 0) {
        *system = strdup(QWEN_SYSTEM);
        return *system ? CHAT_CHATML : -1;
    }
    const char *s = c;
    if (!eat(&s, CHATML_HEAD)) return -1;
    if (strcmp(s, CHATML_BODY) == 0) return CHAT_CHATML;
    if (!eat(&s, CHATML_SYS_A)) return -1;
    const char *end = strstr(s, CHATML_SYS_B);
    if (!end || strcmp(end + strlen(CHATML_SYS_B), CHATML_BODY) != 0) return -1;
    for (const char *p = s; p < end; p++)
        if (*p == '\'' || *p == '\\' || *p == '{' || *p == '}') return -1;
    *system = strndup(s, (size_t)(end - s));
    return *system ? CHAT_CHATML : -1;
}

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

int chat_template_recognise(chat_template *t, const char *text, const char *bos,
                            const char *eos, const char *where, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    t->open_id = t->close_id = -1;
    char *c = canonical(text);
    if (!c) {
        set_err(err, errlen, "%s: out of memory", where);
        return -1;
    }
    const int kind = known_text(c, &t->default_system);
    free(c);
    if (kind < 0) {
        set_err(err, errlen, "%s: its chat template is not one shardlm renders (the plain and "
                "SmolLM2-style ChatML, Qwen2.5's, Llama-2's [INST], Llama-3.1's): --chat-template "
                "chatml, qwen2.5, llama2 or llama3 uses one of those instead", where);
        return -1;
    }
    t->format = (chat_format)kind;
    if (t->format == CHAT_LLAMA2 && (copy_token(t->bos, sizeof t->bos, bos, "bos", err, errlen) ||
                                     copy_token(t->eos, sizeof t->eos, eos, "eos", err, errlen)))
        return -1;
    if (t->format == CHAT_LLAMA3) snprintf(t->bos, sizeof t->bos, LLAMA3_BOS);
    static const char *const names[] = {[CHAT_CHATML] = "chatml", [CHAT_LLAMA2] = "llama2",
                                        [CHAT_LLAMA3] = "llama3"};
    snprintf(t->source, sizeof t->source, "%s (%s%s)", where, names[t->format],
             t->default_system ? " with a default system prompt" : "");
    return 0;
}

/* The template's two special strings. */
static void specials(const chat_template *t, const char *s[2]) {
    s[0] = t->format == CHAT_CHATML   ? "<|im_start|>"
           : t->format == CHAT_LLAMA3 ? "<|start_header_id|>"
                                      : t->bos;
    s[1] = t->format == CHAT_CHATML   ? "<|im_end|>"
           : t->format == CHAT_LLAMA3 ? "<|eot_id|>"
                                      : t->eos;
}

int chat_template_for(chat_template *t, const tokenizer *tok, const char *name, char *err,
                      size_t errlen) {
    const char *b = tokenizer_token_string(tok, tokenizer_bos(tok));
    const char *e = tokenizer_token_string(tok, tokenizer_eos(tok));
    if (name && strcmp(name, "auto") != 0) {
        if (chat_template_named(t, name, err, errlen) != 0) return -1;
        if (t->format == CHAT_LLAMA2) { /* the model's own bos/eos strings where it has them */
            if (b) snprintf(t->bos, sizeof t->bos, "%s", b);
            if (e) snprintf(t->eos, sizeof t->eos, "%s", e);
        }
    } else {
        const char *text = tokenizer_chat_template(tok);
        if (!text) {
            set_err(err, errlen, "%s: the model has no chat template (tokenizer_config.json's "
                    "chat_template, chat_template.jinja); --chat-template "
                    "chatml|qwen2.5|llama2|llama3 picks one", tokenizer_path(tok));
            return -1;
        }
        if (chat_template_recognise(t, text, b, e, tokenizer_chat_template_path(tok), err,
                                    errlen) != 0)
            return -1;
    }
    const char *s[2];
    specials(t, s);
    t->open_id = tokenizer_token_id(tok, s[0]);
    t->close_id = tokenizer_token_id(tok, s[1]);
    /* without them as tokens the template's markers would be trained as plain text */
    if (t->format == CHAT_CHATML && (t->open_id < 0 || t->close_id < 0))
        set_err(err, errlen, "%s: the chatml chat template needs the tokens <|im_start|> and "
                "<|im_end|>, which this tokenizer does not have", tokenizer_path(tok));
    else if (t->format == CHAT_LLAMA2 && (!b || !e || t->open_id < 0 || t->close_id < 0))
        set_err(err, errlen, "%s: the llama2 chat template needs a bos and an eos token, which "
                "this tokenizer does not have", tokenizer_path(tok));
    else if (t->format == CHAT_LLAMA3 &&
             (t->open_id < 0 || t->close_id < 0 || tokenizer_token_id(tok, LLAMA3_BOS) < 0 ||
              tokenizer_token_id(tok, "<|end_header_id|>") < 0))
        set_err(err, errlen, "%s: the llama3 chat template needs the tokens <|begin_of_text|>, "
                "<|start_header_id|>, <|end_header_id|> and <|eot_id|>, which this tokenizer "
                "does not have", tokenizer_path(tok));
    else
        return 0;
    chat_template_free(t);
    return -1;
}

void chat_template_free(chat_template *t) {
    free(t->default_system);
    t->default_system = NULL;
}

/* ---------------------------------------------------------------- rendering */

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
        size_t k = utf8_valid_len(p, (size_t)(e - p)), len;
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

/* Text s[0, len) as pieces: the template's special strings in it, where the tokenizer has
 * them, as their ids, the rest as text; all trained or not. */
static int put_text(const chat_template *t, doc_pieces *out, const char *s, size_t len,
                    int trained) {
    const char *sp[2];
    specials(t, sp);
    const int32_t id[2] = {t->open_id, t->close_id};
    const char *end = s + len;
    while (s < end) {
        const char *hit = NULL;
        int which = -1;
        for (int k = 0; k < 2; k++) {
            if (id[k] < 0 || !sp[k][0]) continue;
            const char *h = memmem(s, (size_t)(end - s), sp[k], strlen(sp[k]));
            if (h && (!hit || h < hit)) hit = h, which = k;
        }
        const char *stop = hit ? hit : end;
        if (stop > s && doc_pieces_text(out, s, (size_t)(stop - s), trained) != 0) return -1;
        if (!hit) break;
        if (doc_pieces_token(out, id[which], sp[which], trained) != 0) return -1;
        s = hit + strlen(sp[which]);
    }
    return 0;
}

/* Special string k of the template: its id where known, else its text. */
static int put_special(const chat_template *t, doc_pieces *out, int k, int trained) {
    const char *sp[2];
    specials(t, sp);
    const int32_t id = k ? t->close_id : t->open_id;
    return id >= 0 ? doc_pieces_token(out, id, sp[k], trained)
                   : doc_pieces_text(out, sp[k], strlen(sp[k]), trained);
}

#define PUT(call)                                                                              \
    do {                                                                                       \
        if ((call) != 0) {                                                                     \
            set_err(err, errlen, "out of memory rendering a conversation");                    \
            return -1;                                                                         \
        }                                                                                      \
    } while (0)
#define PUT_TEXT(s, trained) PUT(put_text(t, out, (s), strlen(s), (trained)))

static int render_chatml(const chat_template *t, const chat_message *m, int n, int gen,
                         doc_pieces *out, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        if (i == 0 && t->default_system && strcmp(m[0].role, "system") != 0) {
            PUT(put_special(t, out, 0, 0));
            PUT_TEXT("system\n", 0);
            PUT_TEXT(t->default_system, 0);
            PUT(put_special(t, out, 1, 0));
            PUT_TEXT("\n", 0);
        }
        const int trained = strcmp(m[i].role, "assistant") == 0;
        PUT(put_special(t, out, 0, 0));
        PUT_TEXT(m[i].role, 0);
        PUT_TEXT("\n", 0);
        PUT_TEXT(m[i].content, trained);
        PUT(put_special(t, out, 1, trained));
        PUT_TEXT("\n", 0);
    }
    if (gen) {
        PUT(put_special(t, out, 0, 0));
        PUT_TEXT("assistant\n", 0);
    }
    return 0;
}

static int render_llama2(const chat_template *t, const chat_message *m, int n,
                         doc_pieces *out, char *err, size_t errlen) {
    const int first = n > 0 && strcmp(m[0].role, "system") == 0;
    byte_buf content = {0};
    int rc = 0;
    for (int i = first; rc == 0 && i < n; i++) {
        const int k = i - first, user = strcmp(m[i].role, "user") == 0;
        if (!user && strcmp(m[i].role, "assistant") != 0) {
            /* the Jinja template drops a system message at an odd place silently and
             * raises at an even one: refused wherever it is */
            set_err(err, errlen, "message %d: a system message comes first or not at all "
                    "(llama2)", i + 1);
            rc = -1;
            break;
        }
        if (user != (k % 2 == 0)) {
            set_err(err, errlen, "message %d is '%s': after an optional system message, roles "
                    "must alternate user/assistant/user/... (llama2)", i + 1, m[i].role);
            rc = -1;
            break;
        }
        /* the system message joins the first turn's content, and strip() takes both */
        content.n = 0;
        if (k == 0 && first)
            rc = byte_buf_append(&content, "<<SYS>>\n", 8) ||
                 byte_buf_append(&content, m[0].content, strlen(m[0].content)) ||
                 byte_buf_append(&content, "\n<</SYS>>\n\n", 11);
        rc = rc || byte_buf_append(&content, m[i].content, strlen(m[i].content));
        size_t len = content.n;
        const char *c = py_strip(content.data ? content.data : "", &len);
        if (rc == 0 && user)
            rc = put_special(t, out, 0, 0) || put_text(t, out, "[INST] ", 7, 0) ||
                 put_text(t, out, c, len, 0) || put_text(t, out, " [/INST]", 8, 0);
        else if (rc == 0)
            rc = put_text(t, out, " ", 1, 1) || put_text(t, out, c, len, 1) ||
                 put_text(t, out, " ", 1, 1) || put_special(t, out, 1, 1);
        if (rc) set_err(err, errlen, "out of memory rendering a conversation");
    }
    free(content.data);
    return rc ? -1 : 0;
}

/* One llama3 turn: the header of role, content stripped, <|eot_id|>; content and
 * <|eot_id|> trained or not. */
static int put_llama3_turn(const chat_template *t, doc_pieces *out, const char *role,
                           const char *content, int trained) {
    size_t len = strlen(content);
    const char *c = py_strip(content, &len);
    return put_special(t, out, 0, 0) || put_text(t, out, role, strlen(role), 0) ||
           put_text(t, out, "<|end_header_id|>\n\n", 19, 0) ||
           put_text(t, out, c, len, trained) || put_special(t, out, 1, trained);
}

static int render_llama3(const chat_template *t, const chat_message *m, int n, int gen,
                         doc_pieces *out, char *err, size_t errlen) {
    const int first = n > 0 && strcmp(m[0].role, "system") == 0;
    size_t len = first ? strlen(m[0].content) : 0;
    const char *sys = first ? py_strip(m[0].content, &len) : "";
    int rc = put_text(t, out, t->bos, strlen(t->bos), 0) || put_special(t, out, 0, 0) ||
             put_text(t, out, "system<|end_header_id|>\n\n", 25, 0) ||
             put_text(t, out, LLAMA3_SYSTEM_HEAD, strlen(LLAMA3_SYSTEM_HEAD), 0) ||
             put_text(t, out, sys, len, 0) || put_special(t, out, 1, 0);
    for (int i = first; rc == 0 && i < n; i++)
        rc = put_llama3_turn(t, out, m[i].role, m[i].content, strcmp(m[i].role, "assistant") == 0);
    if (rc == 0 && gen)
        rc = put_special(t, out, 0, 0) ||
             put_text(t, out, "assistant<|end_header_id|>\n\n", 28, 0);
    if (rc) set_err(err, errlen, "out of memory rendering a conversation");
    return rc ? -1 : 0;
}

int chat_render_pieces(const chat_template *t, const chat_message *m, int n,
                       int add_generation_prompt, doc_pieces *out, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        if (!m[i].role || !m[i].content ||
            (strcmp(m[i].role, "system") && strcmp(m[i].role, "user") &&
             strcmp(m[i].role, "assistant"))) {
            set_err(err, errlen, "message %d: unknown role '%.40s' (system, user or assistant)",
                    i + 1, m[i].role ? m[i].role : "(none)");
            return -1;
        }
    if (t->format == CHAT_CHATML)
        return render_chatml(t, m, n, add_generation_prompt, out, err, errlen);
    if (t->format == CHAT_LLAMA3)
        return render_llama3(t, m, n, add_generation_prompt, out, err, errlen);
    return render_llama2(t, m, n, out, err, errlen);
}

int chat_render(const chat_template *t, const chat_message *m, int n,
                int add_generation_prompt, byte_buf *out, char *err, size_t errlen) {
    doc_pieces d = {0};
    int rc = chat_render_pieces(t, m, n, add_generation_prompt, &d, err, errlen);
    if (rc == 0 && byte_buf_append(out, d.text.data ? d.text.data : "", d.text.n) != 0) {
        set_err(err, errlen, "out of memory rendering a conversation");
        rc = -1;
    }
    doc_pieces_free(&d);
    return rc;
}
