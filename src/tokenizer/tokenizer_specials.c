/* Special tokens and the chat template of a model directory, read as transformers reads
 * them. The whole precedence, in one place (first found wins):
 *
 *   bos, pad, the eos   special_tokens_map.json's bos_token / eos_token / pad_token (a
 *                       string or {"content": ...}; it overrides tokenizer_config.json, as
 *                       in transformers' from_pretrained), tokenizer_config.json's, the
 *                       tokenizer file's own (SentencePiece: the model's bos/eos/pad ids;
 *                       tokenizer.json: the tokens its TemplateProcessing puts around a
 *                       text), generation_config.json's bos/eos/pad_token_id, config.json's
 *   the other eos ids   generation_config.json's eos_token_id (a number or a list), else
 *                       config.json's: all of them are kept after the eos above, without
 *                       repeats (generation stops at any)
 *   add_bos, add_eos    tokenizer_config.json's add_bos_token / add_eos_token, else the
 *                       tokenizer file's (SentencePiece: bos yes when the model has one, eos
 *                       no, LlamaTokenizer's defaults; tokenizer.json: its post-processor)
 *   chat template       chat_template.jinja, else tokenizer_config.json's chat_template (a
 *                       string, or the template named "default" of a list)
 *
 * Token strings are looked up in the tokenizer; tokenizer_config.json's
 * added_tokens_decoder must agree with it (shardlm takes added tokens from tokenizer.json
 * only). A JSON file that exists but does not parse, a token that is not in the
 * vocabulary, an id out of range, or add_bos without a bos are errors naming the file. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json_text.h"
#include "src/tokenizer/tokenizer_specials.h"

enum { CFG_SPECIAL_MAP, CFG_TOKENIZER, CFG_GENERATION, CFG_MODEL, CFG_N };
static const char *const cfg_names[CFG_N] = {"special_tokens_map.json", "tokenizer_config.json",
                                             "generation_config.json", "config.json"};

typedef struct specials_ctx {
    tokenizer *t;
    cJSON *json[CFG_N]; /* NULL when the file is absent */
    char path[CFG_N][1100];
} specials_ctx;

/* Reads DIR/NAME if it exists; a file that exists must be a JSON object. */
static int load_optional(specials_ctx *c, int which, char *err, size_t errlen) {
    snprintf(c->path[which], sizeof c->path[which], "%s/%s", c->t->dir, cfg_names[which]);
    struct stat st;
    if (stat(c->path[which], &st) != 0) return 0;
    size_t len;
    char *text = tokenizer_read_file(c->path[which], &len, err, errlen);
    if (!text) return -1;
    c->json[which] = json_text_parse_file(c->path[which], text, len, 0, err, errlen);
    free(text);
    if (!c->json[which]) return -1;
    if (!cJSON_IsObject(c->json[which])) {
        tokenizer_set_err(err, errlen, "%s: valid JSON but not an object",
                          c->path[which]);
        return -1;
    }
    return 0;
}

/* The id a tokenizer-config entry names ("<s>" or {"content": "<s>", ...}); 0 with *id
 * unchanged when the entry is absent or null. */
static int token_entry(specials_ctx *c, int which, const char *key, int32_t *id, char *err,
                       size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->json[which], key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) {
        tokenizer_set_err(err, errlen, "%s: \"%s\" must be a string or {\"content\": ...}",
                          c->path[which], key);
        return -1;
    }
    int32_t found = c->t->ops->token_id(c->t->impl, v->valuestring);
    if (found < 0) {
        tokenizer_set_err(err, errlen, "%s: %s \"%.80s\" is not a token of %s", c->path[which],
                          key, v->valuestring, c->t->path);
        return -1;
    }
    *id = found;
    return 0;
}

/* An id member of config.json / generation_config.json: a number, or a list when `all`
 * (then every element is appended to *list); 0 with nothing done when absent or null. */
static int id_entry(specials_ctx *c, int which, const char *key, int32_t *first,
                    int32_t **list, int *n_list, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->json[which], key);
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *e = cJSON_IsArray(v) ? v->child : v;
    for (; e; e = cJSON_IsArray(v) ? e->next : NULL) {
        double d = e->valuedouble;
        if (!cJSON_IsNumber(e) || d != (double)(int64_t)d || d < 0 || d >= c->t->vocab_size) {
            tokenizer_set_err(err, errlen,
                              "%s: \"%s\" must be a token id (or a list of them) below the "
                              "vocabulary size %u",
                              c->path[which], key, c->t->vocab_size);
            return -1;
        }
        if (*first < 0) *first = (int32_t)d;
        if (list) {
            int32_t *g = realloc(*list, (size_t)(*n_list + 1) * sizeof *g);
            if (!g) {
                tokenizer_set_err(err, errlen, "%s: out of memory", c->path[which]);
                return -1;
            }
            *list = g;
            (*list)[(*n_list)++] = (int32_t)d;
        }
    }
    return 0;
}

/* One of bos/eos/pad along the precedence chain of the file comment. */
static int resolve_token(specials_ctx *c, const char *name, int32_t from_file, int32_t *out,
                         char *err, size_t errlen) {
    char key[32], id_key[32];
    snprintf(key, sizeof key, "%s_token", name);
    snprintf(id_key, sizeof id_key, "%s_token_id", name);
    int32_t id = -1;
    if (token_entry(c, CFG_SPECIAL_MAP, key, &id, err, errlen) != 0) return -1;
    if (id < 0 && token_entry(c, CFG_TOKENIZER, key, &id, err, errlen) != 0) return -1;
    if (id < 0) id = from_file;
    if (id < 0 && id_entry(c, CFG_GENERATION, id_key, &id, NULL, NULL, err, errlen) != 0)
        return -1;
    if (id < 0 && id_entry(c, CFG_MODEL, id_key, &id, NULL, NULL, err, errlen) != 0) return -1;
    *out = id;
    return 0;
}

static int resolve_flag(specials_ctx *c, const char *key, int from_file, int *out, char *err,
                        size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->json[CFG_TOKENIZER], key);
    *out = from_file;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) {
        tokenizer_set_err(err, errlen, "%s: \"%s\" must be true or false",
                          c->path[CFG_TOKENIZER], key);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

/* added_tokens_decoder: {"ID": {"content": ...}, ...} must name the tokenizer's tokens. */
static int check_added_tokens(specials_ctx *c, char *err, size_t errlen) {
    const cJSON *dec =
        cJSON_GetObjectItemCaseSensitive(c->json[CFG_TOKENIZER], "added_tokens_decoder");
    if (!dec) return 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, dec) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        char *end;
        long id = strtol(e->string ? e->string : "", &end, 10);
        if (!cJSON_IsString(content) || !e->string || *end || end == e->string) {
            tokenizer_set_err(err, errlen,
                              "%s: added_tokens_decoder entries must be \"ID\": {\"content\": "
                              "...}",
                              c->path[CFG_TOKENIZER]);
            return -1;
        }
        if (c->t->ops->token_id(c->t->impl, content->valuestring) != id) {
            tokenizer_set_err(err, errlen,
                              "%s: added token %ld \"%.80s\" is not token %ld of %s (added "
                              "tokens are read from tokenizer.json only)",
                              c->path[CFG_TOKENIZER], id, content->valuestring, id,
                              c->t->path);
            return -1;
        }
    }
    return 0;
}

static int resolve_chat_template(specials_ctx *c, char *err, size_t errlen) {
    char path[1100];
    snprintf(path, sizeof path, "%s/chat_template.jinja", c->t->dir);
    struct stat st;
    if (stat(path, &st) == 0) {
        size_t len;
        c->t->chat_template = tokenizer_read_file(path, &len, err, errlen);
        snprintf(c->t->chat_template_path, sizeof c->t->chat_template_path, "%s", path);
        return c->t->chat_template ? 0 : -1;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->json[CFG_TOKENIZER], "chat_template");
    if (cJSON_IsArray(v)) {
        const cJSON *e, *pick = NULL;
        cJSON_ArrayForEach(e, v) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0) pick = e;
        }
        v = pick ? cJSON_GetObjectItemCaseSensitive(pick, "template") : NULL;
    }
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) {
        tokenizer_set_err(err, errlen,
                          "%s: \"chat_template\" must be a string or a list of {\"name\", "
                          "\"template\"} holding one named \"default\"",
                          c->path[CFG_TOKENIZER]);
        return -1;
    }
    c->t->chat_template = strdup(v->valuestring);
    snprintf(c->t->chat_template_path, sizeof c->t->chat_template_path, "%s",
             c->path[CFG_TOKENIZER]);
    if (!c->t->chat_template) {
        tokenizer_set_err(err, errlen, "%s: out of memory", c->path[CFG_TOKENIZER]);
        return -1;
    }
    return 0;
}

static int resolve(specials_ctx *c, char *err, size_t errlen) {
    tokenizer *t = c->t;
    for (int i = 0; i < CFG_N; i++)
        if (t->dir[0] && load_optional(c, i, err, errlen) != 0) return -1;
    if (check_added_tokens(c, err, errlen) != 0) return -1;
    int32_t eos = -1;
    if (resolve_token(c, "bos", t->file.bos, &t->bos, err, errlen) != 0 ||
        resolve_token(c, "eos", t->file.eos, &eos, err, errlen) != 0 ||
        resolve_token(c, "pad", t->file.pad, &t->pad, err, errlen) != 0)
        return -1;
    /* all eos ids: the eos first, then generation_config.json's (else config.json's) */
    int32_t *more = NULL, ignored = -1;
    int n_more = 0;
    int which = cJSON_GetObjectItemCaseSensitive(c->json[CFG_GENERATION], "eos_token_id")
                    ? CFG_GENERATION
                    : CFG_MODEL;
    int rc = id_entry(c, which, "eos_token_id", &ignored, &more, &n_more, err, errlen);
    if (rc == 0 && (eos >= 0 || n_more > 0)) {
        t->eos_ids = malloc((size_t)(n_more + 1) * sizeof *t->eos_ids);
        if (!t->eos_ids) {
            tokenizer_set_err(err, errlen, "%s: out of memory", t->path);
            rc = -1;
        }
        if (eos >= 0 && t->eos_ids) t->eos_ids[t->n_eos++] = eos;
        for (int i = 0; t->eos_ids && i < n_more; i++) {
            int seen = 0;
            for (int j = 0; j < t->n_eos; j++) seen |= t->eos_ids[j] == more[i];
            if (!seen) t->eos_ids[t->n_eos++] = more[i];
        }
    }
    free(more);
    if (rc != 0) return -1;
    if (resolve_flag(c, "add_bos_token", t->file.add_bos, &t->add_bos, err, errlen) != 0 ||
        resolve_flag(c, "add_eos_token", t->file.add_eos, &t->add_eos, err, errlen) != 0)
        return -1;
    if ((t->add_bos && t->bos < 0) || (t->add_eos && t->n_eos == 0)) {
        tokenizer_set_err(err, errlen, "%s: add_%s_token is true but no %s token is defined",
                          c->json[CFG_TOKENIZER] ? c->path[CFG_TOKENIZER] : t->path,
                          t->add_bos && t->bos < 0 ? "bos" : "eos",
                          t->add_bos && t->bos < 0 ? "bos" : "eos");
        return -1;
    }
    return resolve_chat_template(c, err, errlen);
}

int tokenizer_specials_resolve(tokenizer *t, char *err, size_t errlen) {
    specials_ctx c = {.t = t};
    int rc = resolve(&c, err, errlen);
    for (int i = 0; i < CFG_N; i++) cJSON_Delete(c.json[i]);
    return rc;
}
