/* `data prepare`'s input formats, record by record into documents, and the documents
 * into token-file ids and flags, with the max_doc_len policy; generate's prompt file
 * (data_prepare.h). */
#include "src/data/data_prepare.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/errmsg.h"
#include "io/json_text.h"
#include "src/base/utf8.h"

int alpaca_prompt(byte_buf *out, const char *instruction, const char *input) {
    static const char with_input[] =
        "Below is an instruction that describes a task, paired with an input that provides "
        "further context. Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n";
    static const char without[] = "Below is an instruction that describes a task. Write a "
                                  "response that appropriately completes the request.\n\n"
                                  "### Instruction:\n";
    const int has_input = input && input[0];
    int rc = has_input ? byte_buf_append(out, with_input, sizeof with_input - 1)
                       : byte_buf_append(out, without, sizeof without - 1);
    rc |= byte_buf_append(out, instruction, strlen(instruction));
    if (has_input)
        rc |= byte_buf_append(out, "\n\n### Input:\n", 13) |
              byte_buf_append(out, input, strlen(input));
    rc |= byte_buf_append(out, "\n\n### Response:\n", 16);
    return rc ? -1 : 0;
}

/* The JSON type of v, for messages. */
static const char *json_type(const cJSON *v) {
    return cJSON_IsString(v) ? "a string" : cJSON_IsNumber(v) ? "a number"
         : cJSON_IsBool(v)   ? "a boolean" : cJSON_IsNull(v)  ? "null"
         : cJSON_IsArray(v)  ? "an array"  : "an object";
}

/* obj[key] as a string: *out = NULL when absent and !required. Errors name the key. */
static int get_string(const cJSON *obj, const char *key, int required, const char **out,
                      const char *where, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = NULL;
    if (!v) {
        if (required) snprintf(err, errlen, "%smissing \"%s\"", where, key);
        return required ? -1 : 0;
    }
    if (!cJSON_IsString(v)) {
        snprintf(err, errlen, "%s\"%s\" must be a string, not %s", where, key, json_type(v));
        return -1;
    }
    *out = v->valuestring;
    return 0;
}

/* A document without a template: bos as the model adds it, the prompt (when there is one;
 * it and the bos untrained), the text, the eos (when the tokenizer has one). */
static int plain_doc(const tokenizer *tok, doc_pieces *d, const char *prompt, const char *text,
                     size_t len) {
    const int flags = tokenizer_document_flags(tok);
    const int32_t bos = tokenizer_bos(tok), eos = tokenizer_eos(tok);
    int rc = 0;
    if (flags & TOKENIZER_ADD_BOS)
        rc |= doc_pieces_token(d, bos, tokenizer_token_string(tok, bos), !prompt);
    if (prompt) rc |= doc_pieces_text(d, prompt, strlen(prompt), 0);
    rc |= doc_pieces_text(d, text, len, 1);
    if (flags & TOKENIZER_ADD_EOS)
        rc |= doc_pieces_token(d, eos, tokenizer_token_string(tok, eos), 1);
    return rc ? -1 : 0;
}

/* A prompt and its response: a two-turn chat with a template, else a plain document. */
static int pair_doc(tokenizer *tok, const prepare_options *o, const char *prompt,
                    const char *response, doc_pieces *d, char *err, size_t errlen) {
    if (o->tmpl) {
        const chat_message m[2] = {{"user", prompt}, {"assistant", response}};
        return chat_render_pieces(o->tmpl, m, 2, 0, d, err, errlen);
    }
    if (plain_doc(tok, d, prompt, response, strlen(response)) == 0) return 0;
    snprintf(err, errlen, "out of memory");
    return -1;
}

static int prompt_response_doc(tokenizer *tok, const prepare_options *o, const cJSON *rec,
                               doc_pieces *d, byte_buf *scratch, char *err, size_t errlen) {
    const char *prompt, *response, *instruction, *input, *output;
    if (get_string(rec, "prompt", 0, &prompt, "", err, errlen) ||
        get_string(rec, "response", 0, &response, "", err, errlen) ||
        get_string(rec, "instruction", 0, &instruction, "", err, errlen) ||
        get_string(rec, "input", 0, &input, "", err, errlen) ||
        get_string(rec, "output", 0, &output, "", err, errlen))
        return -1;
    const int pr = prompt || response, alpaca = instruction || input || output;
    const char *missing = pr && alpaca ? NULL
                        : pr           ? (!prompt ? "prompt" : !response ? "response" : NULL)
                        : alpaca       ? (!instruction ? "instruction" : !output ? "output" : NULL)
                                       : "prompt";
    if (pr && alpaca) {
        snprintf(err, errlen, "a record holds \"prompt\" and \"response\", or Alpaca's "
                 "\"instruction\", \"input\" (optional) and \"output\", not both");
        return -1;
    }
    if (missing) {
        snprintf(err, errlen, "missing \"%s\" (a record holds \"prompt\" and \"response\", or "
                 "Alpaca's \"instruction\", \"input\" (optional) and \"output\")", missing);
        return -1;
    }
    if (alpaca) {
        scratch->n = 0;
        if (alpaca_prompt(scratch, instruction, input) != 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        prompt = scratch->data;
        response = output;
    }
    if (chat_text_is_blank(response)) {
        snprintf(err, errlen, "empty \"%s\": nothing to train on", alpaca ? "output" : "response");
        return -1;
    }
    return pair_doc(tok, o, prompt, response, d, err, errlen);
}

/* rec's "messages" (list, not NULL) into (*msgs)[0, *n) (the strings are rec's), grown
 * as needed (*cap). */
static int read_messages(const cJSON *list, chat_message **msgs, int *cap, int *n, char *err,
                         size_t errlen) {
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0) {
        snprintf(err, errlen, "\"messages\" must be a non-empty array, not %s",
                 cJSON_IsArray(list) ? "an empty one" : json_type(list));
        return -1;
    }
    const int len = cJSON_GetArraySize(list);
    if (len > *cap) {
        chat_message *g = realloc(*msgs, (size_t)len * sizeof *g);
        if (!g) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        *msgs = g;
        *cap = len;
    }
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, list) {
        char where[32];
        snprintf(where, sizeof where, "message %d: ", i + 1);
        if (!cJSON_IsObject(m)) {
            snprintf(err, errlen, "%smust be an object, not %s", where, json_type(m));
            return -1;
        }
        chat_message *c = &(*msgs)[i++];
        if (get_string(m, "role", 1, &c->role, where, err, errlen) ||
            get_string(m, "content", 1, &c->content, where, err, errlen))
            return -1;
    }
    *n = i;
    return 0;
}

static int chat_doc(const prepare_options *o, const cJSON *rec, doc_pieces *d,
                    chat_message **msgs, int *cap, char *err, size_t errlen) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(rec, "messages");
    if (!list) {
        snprintf(err, errlen, "missing \"messages\"");
        return -1;
    }
    int n, assistants = 0;
    if (read_messages(list, msgs, cap, &n, err, errlen) != 0) return -1;
    for (int i = 0; i < n; i++) {
        const chat_message *c = &(*msgs)[i];
        if (strcmp(c->role, "assistant") != 0) continue;
        assistants++;
        if (chat_text_is_blank(c->content)) {
            snprintf(err, errlen, "message %d: empty assistant message: nothing to train on",
                     i + 1);
            return -1;
        }
    }
    if (chat_render_pieces(o->tmpl, *msgs, n, 0, d, err, errlen) != 0) return -1;
    if (!assistants) {
        snprintf(err, errlen, "no assistant message: nothing to train on");
        return -1;
    }
    return 0;
}

/* 0 when line[0, len) is UTF-8; else the 1-based byte of the first bad sequence. */
static size_t bad_utf8_at(const char *line, size_t len) {
    const unsigned char *p = (const unsigned char *)line;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_valid_len(p + i, len - i);
        if (!k) return i + 1;
        i += k;
    }
    return 0;
}

static int json_blank(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

/* The next line of data[*a, len) (without its newline) in *s, *n; its number in *line.
 * 0 past the end. */
static int next_line(const char *data, size_t len, size_t *a, const char **s, size_t *n,
                     uint64_t *line) {
    if (*a >= len) return 0;
    const char *nl = memchr(data + *a, '\n', len - *a);
    const size_t b = nl ? (size_t)(nl - data) : len;
    *s = data + *a;
    *n = b - *a;
    *a = b + 1;
    ++*line;
    return 1;
}

/* One JSONL line as a JSON object: UTF-8, no NUL (raw or \u0000: it would cut a text
 * short), no key given twice (it would be read as the first). NULL with err. */
static cJSON *parse_record(const char *line, size_t len, char *err, size_t errlen) {
    size_t bad = bad_utf8_at(line, len);
    if (bad) {
        snprintf(err, errlen, "invalid UTF-8 " IO_AT_BYTE, bad);
        return NULL;
    }
    size_t at;
    char why[512];
    cJSON *rec = json_text_parse(line, len, JSON_TEXT_NO_NUL | JSON_TEXT_UNIQUE_KEYS, &at, why,
                                 sizeof why);
    if (!rec) {
        if (at < len) snprintf(err, errlen, "%s " IO_AT_BYTE, why, at + 1);
        else snprintf(err, errlen, "%s", why);
        return NULL;
    }
    if (!cJSON_IsObject(rec)) {
        snprintf(err, errlen, "a record must be a JSON object, not %s", json_type(rec));
        cJSON_Delete(rec);
        return NULL;
    }
    return rec;
}

/* One JSONL record into d. */
static int record_doc(tokenizer *tok, const prepare_options *o, const char *line, size_t len,
                      doc_pieces *d, byte_buf *scratch, chat_message **msgs, int *cap,
                      char *err, size_t errlen) {
    cJSON *rec = parse_record(line, len, err, errlen);
    if (!rec) return -1;
    int rc = -1;
    if (o->format == TOKEN_FORMAT_JSONL_TEXT) {
        const char *text;
        rc = get_string(rec, "text", 1, &text, "", err, errlen);
        if (rc == 0 && !text[0]) {
            snprintf(err, errlen, "empty \"text\"");
            rc = -1;
        }
        if (rc == 0 && plain_doc(tok, d, NULL, text, strlen(text)) != 0) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
        }
    } else if (o->format == TOKEN_FORMAT_PROMPT_RESPONSE) {
        rc = prompt_response_doc(tok, o, rec, d, scratch, err, errlen);
    } else {
        rc = chat_doc(o, rec, d, msgs, cap, err, errlen);
    }
    cJSON_Delete(rec);
    return rc;
}

int prepare_records(tokenizer *tok, const prepare_options *o, const char *path,
                    const char *data, size_t len, prepare_visit visit, void *ctx, char *err,
                    size_t errlen) {
    doc_pieces d = {0};
    byte_buf scratch = {0};
    chat_message *msgs = NULL;
    int cap = 0, rc = 0;
    char why[1024] = "";
    uint64_t line = 0, records = 0;
    if (o->format == TOKEN_FORMAT_TEXT) {
        line = 1;
        if (plain_doc(tok, &d, NULL, data, len) != 0) {
            snprintf(why, sizeof why, "out of memory");
            rc = -1;
        } else if (visit(ctx, 1, &d, err, errlen) != 0) {
            rc = -2;
        }
        records = 1;
    } else {
        const char *s;
        size_t a = 0, n;
        while (rc == 0 && next_line(data, len, &a, &s, &n, &line)) {
            if (json_blank(s, n)) continue;
            doc_pieces_clear(&d);
            rc = record_doc(tok, o, s, n, &d, &scratch, &msgs, &cap, why, sizeof why);
            if (rc == 0 && visit(ctx, line, &d, err, errlen) != 0) rc = -2;
            records++;
        }
        if (rc == 0 && records == 0) {
            io_set_err(err, errlen, "%s: no records (every line is blank)", path);
            rc = -2;
        }
    }
    if (rc == -1) io_set_err(err, errlen, "%s:%llu: %s", path, (unsigned long long)line, why);
    doc_pieces_free(&d);
    free(scratch.data);
    free(msgs);
    return rc == 0 ? 0 : -1;
}

int prompt_records(const char *path, const char *data, size_t len, prompt_visit visit,
                   void *ctx, char *err, size_t errlen) {
    chat_message *msgs = NULL;
    int cap = 0, rc = 0;
    char why[1024] = "";
    uint64_t line = 0, records = 0;
    const char *s;
    size_t a = 0, n;
    while (rc == 0 && next_line(data, len, &a, &s, &n, &line)) {
        if (json_blank(s, n)) continue;
        records++;
        cJSON *rec = parse_record(s, n, why, sizeof why);
        rc = rec ? 0 : -1;
        const cJSON *list = rec ? cJSON_GetObjectItemCaseSensitive(rec, "messages") : NULL;
        const char *prompt = NULL;
        if (rc == 0) rc = get_string(rec, "prompt", 0, &prompt, "", why, sizeof why);
        if (rc == 0 && !prompt == !list) {
            snprintf(why, sizeof why, "a prompt line holds \"prompt\" (a string) or "
                     "\"messages\" (an array of {\"role\", \"content\"}), %s",
                     prompt ? "not both" : "neither here");
            rc = -1;
        }
        int n_msgs = 0;
        if (rc == 0 && list) rc = read_messages(list, &msgs, &cap, &n_msgs, why, sizeof why);
        if (rc == 0 && visit(ctx, line, prompt, list ? msgs : NULL, n_msgs, err, errlen) != 0)
            rc = -2;
        cJSON_Delete(rec);
    }
    if (rc == 0 && records == 0) {
        io_set_err(err, errlen, "%s: no prompts (every line is blank)", path);
        rc = -2;
    }
    if (rc == -1) io_set_err(err, errlen, "%s:%llu: %s", path, (unsigned long long)line, why);
    free(msgs);
    return rc == 0 ? 0 : -1;
}

/* The prepare_file visitor: tokenizes a document and applies max_doc_len. */
typedef struct prepare_ctx {
    tokenizer *tok;
    const prepare_options *o;
    const char *path;
    const char *data; /* the file's text */
    prepared *out;
} prepare_ctx;

static int add_document(void *vctx, uint64_t line, const doc_pieces *d, char *err,
                        size_t errlen) {
    prepare_ctx *c = vctx;
    prepared *p = c->out;
    const size_t start = p->ids.n;
    char why[1024];
    if (doc_pieces_encode(c->tok, d, &p->ids, &p->flags, why, sizeof why) != 0) {
        /* a text file is one document whose one run of text is the file's: the byte the
         * tokenizer points at has its own line (a JSONL record's text has the record's) */
        const size_t off = tokenizer_error_offset(c->tok);
        if (c->o->format == TOKEN_FORMAT_TEXT && off != (size_t)-1) {
            unsigned long long at_line;
            size_t at_byte;
            io_text_position(c->data, off, &at_line, &at_byte);
            io_set_err(err, errlen, "%s:%llu: %s " IO_AT_BYTE, c->path, at_line, why, at_byte);
        } else {
            io_set_err(err, errlen, "%s:%llu: %s", c->path, (unsigned long long)line, why);
        }
        return -1;
    }
    p->records++;
    const uint64_t n = p->ids.n - start, max = c->o->max_doc_len;
    if (max && n > max) {
        if (!p->overlong_first_line) p->overlong_first_line = line;
        if (n > p->overlong_longest) p->overlong_longest = n, p->overlong_longest_line = line;
        if (c->o->drop_overlong) {
            p->ids.n = p->flags.n = start;
            p->dropped++;
            return 0;
        }
        p->ids.n = p->flags.n = start + (size_t)max;
        p->truncated++;
    }
    if (p->ids.n == start) {
        io_set_err(err, errlen, "%s:%llu: the document has no token", c->path,
                   (unsigned long long)line);
        return -1;
    }
    p->flags.data[start] |= TOKEN_DOC_START;
    int trained = 0;
    for (size_t i = start; i < p->ids.n && !trained; i++)
        trained = p->flags.data[i] & TOKEN_TRAINED;
    if (!trained && !p->untrained++) p->untrained_first_line = line;
    return 0;
}

int prepare_file(tokenizer *tok, const prepare_options *o, const char *path, const char *data,
                 size_t len, prepared *out, char *err, size_t errlen) {
    prepare_ctx c = {tok, o, path, data, out};
    return prepare_records(tok, o, path, data, len, add_document, &c, err, errlen);
}

void prepared_free(prepared *p) {
    free(p->ids.ids);
    free(p->flags.data);
    memset(p, 0, sizeof *p);
}
