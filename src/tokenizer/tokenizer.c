/* The tokenizer interface (tokenizer.h): opening by name, file or directory, the byte
 * tokenizer, bos/eos around an encode, the id checks of decode, and incremental decoding.
 * The implementations live in tokenizer_sp.cc and tokenizer_hf.c, the special tokens
 * in tokenizer_specials.c. */
#include "src/tokenizer/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/errmsg.h"
#include "src/tokenizer/tokenizer_hf.h"
#include "src/tokenizer/tokenizer_impl.h"
#include "src/tokenizer/tokenizer_sp.h"
#include "src/tokenizer/tokenizer_specials.h"

/* ---- the byte tokenizer: id = byte value ---- */

static int bytes_encode(void *impl, const char *text, size_t len, token_ids *out, size_t *at,
                        char *err, size_t errlen) {
    for (size_t i = 0; i < len; i++)
        if (token_ids_push(out, (unsigned char)text[i]) != 0) {
            tokenizer_set_err(err, errlen, "bytes: out of memory for %zu tokens", len);
            return -1;
        }
    return 0;
}

static int bytes_decode(void *impl, const int32_t *ids, size_t n, int skip_special,
                        byte_buf *out, char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++) {
        char c = (char)ids[i];
        if (byte_buf_append(out, &c, 1) != 0) {
            tokenizer_set_err(err, errlen, "bytes: out of memory decoding %zu tokens", n);
            return -1;
        }
    }
    return 0;
}

static int32_t bytes_token_id(const void *impl, const char *s) { return -1; }
static const char *bytes_token_string(const void *impl, int32_t id) { return NULL; }
static int bytes_is_special(const void *impl, int32_t id) { return 0; }
static void bytes_free(void *impl) {}
static const char *bytes_encoder(const void *impl) { return "bytes"; }

static const tokenizer_ops bytes_ops = {
    .kind = "bytes",
    .encode = bytes_encode,
    .decode = bytes_decode,
    .token_id = bytes_token_id,
    .token_string = bytes_token_string,
    .is_special = bytes_is_special,
    .encoder = bytes_encoder,
    .free = bytes_free,
};

/* ---- opening ---- */

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The tokenizer file a directory holds ("" when none): tokenizer.model first, because a
 * SentencePiece model's tokenizer.json is a conversion of it, and tokenizer.model is what
 * the sentencepiece library (the reference) reads. */
static void dir_tokenizer_file(const char *dir, char *out, size_t outlen) {
    static const char *const names[] = {"tokenizer.model", "tokenizer.json"};
    out[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(out, outlen, "%s/%s", dir, names[i]);
        if (is_file(out)) return;
    }
    out[0] = '\0';
}

int tokenizer_dir_has_one(const char *dir) {
    char path[1100];
    dir_tokenizer_file(dir, path, sizeof path);
    return path[0] != '\0';
}

/* A JSON file starts with '{' after blanks; anything else is taken for SentencePiece. */
static int looks_like_json(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int c;
    while ((c = fgetc(f)) == ' ' || c == '\t' || c == '\n' || c == '\r') {}
    fclose(f);
    return c == '{';
}

int tokenizer_open(tokenizer **out, const char *spec, char *err, size_t errlen) {
    *out = NULL;
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        tokenizer_set_err(err, errlen, "%s: out of memory", spec);
        return -1;
    }
    t->file = (tokenizer_file_specials){.bos = -1, .eos = -1, .pad = -1};
    int rc;
    struct stat st;
    if (strcmp(spec, "bytes") == 0) {
        snprintf(t->path, sizeof t->path, "bytes");
        t->ops = &bytes_ops;
        t->vocab_size = 256;
        rc = 0;
    } else if (strlen(spec) >= sizeof t->path - 32) {
        tokenizer_set_err(err, errlen, "%.200s...: tokenizer path too long", spec);
        rc = -1;
    } else if (stat(spec, &st) != 0) {
        tokenizer_set_err(err, errlen,
                          "%s: no such tokenizer (a tokenizer.model or tokenizer.json file, a "
                          "model directory holding one, or 'bytes'): %s",
                          spec, strerror(errno));
        rc = -1;
    } else {
        if (S_ISDIR(st.st_mode)) {
            snprintf(t->dir, sizeof t->dir, "%s", spec);
            dir_tokenizer_file(spec, t->path, sizeof t->path);
            if (!t->path[0]) {
                tokenizer_set_err(err, errlen,
                                  "%s: directory holds no tokenizer.model or tokenizer.json",
                                  spec);
                tokenizer_free(t);
                return -1;
            }
        } else {
            snprintf(t->path, sizeof t->path, "%s", spec);
            const char *slash = strrchr(spec, '/');
            snprintf(t->dir, sizeof t->dir, "%.*s", slash ? (int)(slash - spec) : 1,
                     slash ? spec : ".");
            if (slash == spec) snprintf(t->dir, sizeof t->dir, "/");
        }
        rc = looks_like_json(t->path) ? tokenizer_hf_open(t, t->path, err, errlen)
                                      : tokenizer_sp_open(t, t->path, err, errlen);
    }
    if (rc == 0) rc = tokenizer_specials_resolve(t, err, errlen);
    if (rc != 0) {
        tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    if (t->ops && t->impl) t->ops->free(t->impl);
    free(t->eos_ids);
    free(t->chat_template);
    free(t);
}

const char *tokenizer_kind(const tokenizer *t) { return t->ops->kind; }
const char *tokenizer_path(const tokenizer *t) { return t->path; }
const char *tokenizer_encoder(const tokenizer *t) { return t->ops->encoder(t->impl); }

/* ---- encode and decode ---- */

int tokenizer_encode(tokenizer *t, const char *text, size_t len, token_ids *out, char *err,
                     size_t errlen) {
    t->error_offset = (size_t)-1;
    return t->ops->encode(t->impl, text, len, out, &t->error_offset, err, errlen);
}

size_t tokenizer_error_offset(const tokenizer *t) { return t->error_offset; }

int tokenizer_encode_with(tokenizer *t, const char *text, size_t len, int flags,
                          token_ids *out, char *err, size_t errlen) {
    t->error_offset = (size_t)-1;
    int32_t eos = tokenizer_eos(t);
    if ((flags & TOKENIZER_ADD_BOS && t->bos < 0) || (flags & TOKENIZER_ADD_EOS && eos < 0)) {
        tokenizer_set_err(err, errlen, "%s: the tokenizer has no %s token", t->path,
                          flags & TOKENIZER_ADD_BOS && t->bos < 0 ? "bos" : "eos");
        return -1;
    }
    if (flags & TOKENIZER_ADD_BOS && token_ids_push(out, t->bos) != 0) goto oom;
    if (tokenizer_encode(t, text, len, out, err, errlen) != 0) return -1;
    if (flags & TOKENIZER_ADD_EOS && token_ids_push(out, eos) != 0) goto oom;
    return 0;
oom:
    tokenizer_set_err(err, errlen, "%s: out of memory", t->path);
    return -1;
}

int tokenizer_default_flags(const tokenizer *t) {
    return (t->add_bos ? TOKENIZER_ADD_BOS : 0) | (t->add_eos ? TOKENIZER_ADD_EOS : 0);
}

int tokenizer_document_flags(const tokenizer *t) {
    return (t->add_bos ? TOKENIZER_ADD_BOS : 0) | (t->n_eos ? TOKENIZER_ADD_EOS : 0);
}

int tokenizer_decode(tokenizer *t, const int32_t *ids, size_t n, int flags, byte_buf *out,
                     char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->vocab_size) {
            tokenizer_set_err(err, errlen, "%s: token id %ld is outside the vocabulary [0, %u)",
                              t->path, (long)ids[i], t->vocab_size);
            return -1;
        }
    return t->ops->decode(t->impl, ids, n, !!(flags & TOKENIZER_SKIP_SPECIAL), out, err, errlen);
}

/* ---- incremental decode ---- */

void tokenizer_stream_init(tokenizer_stream *s, int flags) {
    memset(s, 0, sizeof *s);
    s->flags = flags;
}

void tokenizer_stream_free(tokenizer_stream *s) {
    free(s->ids.ids);
    free(s->a.data);
    free(s->b.data);
    memset(s, 0, sizeof *s);
}

/* Whether text must wait for more tokens: it ends inside a UTF-8 sequence (a byte-level
 * BPE token holding part of a character) or with U+FFFD (SentencePiece's rendering of a
 * byte piece whose character is not complete yet). */
static int ends_unfinished(const char *text, size_t n) {
    if (n >= 3 && memcmp(text + n - 3, "\xEF\xBF\xBD", 3) == 0) return 1;
    /* the last lead byte within 3 bytes of the end, and whether its sequence fits */
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)text[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return c >= 0xC0 && c < 0xF8 && need > back;
    }
    return 0;
}

/* a = decode(ids[prefix, read)), the text released; b = decode(ids[prefix, n)). Both
 * start at the same token, so a leading-space rule applied to the first applies to both.
 * Unless `force`, b is released only when it extends a and ends with whole characters.
 * What is new in b goes to out, and the window moves on. */
static int stream_release(tokenizer *t, tokenizer_stream *s, int force, byte_buf *out,
                          char *err, size_t errlen) {
    s->a.n = s->b.n = 0;
    if (tokenizer_decode(t, s->ids.ids + s->prefix, s->read - s->prefix, s->flags, &s->a, err,
                         errlen) != 0 ||
        tokenizer_decode(t, s->ids.ids + s->prefix, s->ids.n - s->prefix, s->flags, &s->b, err,
                         errlen) != 0)
        return -1;
    /* a.data is NULL while nothing has been released (memcmp must not see it) */
    int ready = s->b.n > s->a.n && !ends_unfinished(s->b.data, s->b.n) &&
                (s->a.n == 0 || memcmp(s->a.data, s->b.data, s->a.n) == 0);
    if (!ready && !force) return 0;
    if (s->b.n > s->a.n && byte_buf_append(out, s->b.data + s->a.n, s->b.n - s->a.n) != 0) {
        tokenizer_set_err(err, errlen, "%s: out of memory", t->path);
        return -1;
    }
    s->prefix = force ? s->ids.n : s->read;
    s->read = s->ids.n;
    return 0;
}

int tokenizer_stream_push(tokenizer *t, tokenizer_stream *s, int32_t id, byte_buf *out,
                          char *err, size_t errlen) {
    if (token_ids_push(&s->ids, id) != 0) {
        tokenizer_set_err(err, errlen, "%s: out of memory", t->path);
        return -1;
    }
    return stream_release(t, s, 0, out, err, errlen);
}

int tokenizer_stream_flush(tokenizer *t, tokenizer_stream *s, byte_buf *out, char *err,
                           size_t errlen) {
    return stream_release(t, s, 1, out, err, errlen);
}

/* ---- special tokens ---- */

int32_t tokenizer_token_id(const tokenizer *t, const char *s) {
    return t->ops->token_id(t->impl, s);
}

const char *tokenizer_token_string(const tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->vocab_size) return NULL;
    return t->ops->token_string(t->impl, id);
}

int tokenizer_is_special(const tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->vocab_size) return 0;
    return t->ops->is_special(t->impl, id);
}

int32_t tokenizer_bos(const tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const tokenizer *t) { return t->n_eos ? t->eos_ids[0] : -1; }
int32_t tokenizer_pad(const tokenizer *t) { return t->pad; }
const int32_t *tokenizer_eos_ids(const tokenizer *t, int *n) {
    *n = t->n_eos;
    return t->eos_ids;
}
int tokenizer_add_bos(const tokenizer *t) { return t->add_bos; }
int tokenizer_add_eos(const tokenizer *t) { return t->add_eos; }
uint32_t tokenizer_vocab_size(const tokenizer *t) { return t->vocab_size; }
const char *tokenizer_chat_template(const tokenizer *t) { return t->chat_template; }
const char *tokenizer_chat_template_path(const tokenizer *t) { return t->chat_template_path; }
