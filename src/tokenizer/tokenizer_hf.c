/* Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Llama-3, SmolLM2), as the
 * `tokenizers` library runs it:
 *
 *   1. added tokens are cut out of the text first (leftmost-longest; the tokens with
 *      "normalized": false on the text, then those with true on what is left, after the
 *      normalizer; lstrip, rstrip and single_word honoured); the normalizer is none, or
 *      NFC (Qwen's: Unicode canonical composition, by utf8proc) on each piece between the
 *      tokens of the first group;
 *   2. each remaining piece goes through the pre-tokenizer: Split (a Regex or String
 *      pattern, any of the five behaviours, invert), Digits (individual_digits), ByteLevel
 *      (add_prefix_space, use_regex: GPT-2's pattern), or a Sequence of them, ByteLevel
 *      last; patterns are PCRE2 with UTF and Unicode properties, JIT-compiled;
 *   3. each pre-token is a word for the BPE (src/tokenizer/bpe.h), on raw bytes;
 *   4. the post-processor (TemplateProcessing, ByteLevel, a Sequence) only says which
 *      special tokens go around a text (the bos/eos defaults); the decoder is ByteLevel.
 *
 * Anything else — another normalizer, another model (WordPiece, Unigram), another pre-tokenizer or
 * decoder, BPE dropout or subword affixes — is refused at load with a message naming it. */
#include <cjson/cJSON.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "io/json_text.h"
#include "src/tokenizer/bpe.h"
#include "src/tokenizer/id_map.h"
#include "src/tokenizer/tokenizer_hf.h"
#include "src/base/utf8.h"

/* GPT-2's pattern, which ByteLevel(use_regex = true) splits with */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef enum split_behavior {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_MERGED_WITH_PREVIOUS,
    SPLIT_MERGED_WITH_NEXT,
    SPLIT_CONTIGUOUS,
} split_behavior;

/* One pre-tokenizer stage: a split by a pattern, and for ByteLevel a prefix space first. */
typedef struct stage {
    pcre2_code *re;          /* NULL: no split (ByteLevel without use_regex) */
    pcre2_match_data *md;
    int jit;                 /* pcre2_jit_compile succeeded */
    split_behavior behavior;
    int invert;
    int add_prefix_space;    /* ByteLevel: prepend ' ' to a piece that does not start with one */
} stage;

typedef struct added_token {
    const char *content;     /* into the cJSON tree's copy, kept in hf->strings */
    size_t len;
    int32_t id;
    int special, lstrip, rstrip, single_word, normalized;
} added_token;

enum { MAX_STAGES = 16 };

typedef struct hf_tokenizer {
    char path[1024];
    bpe *model;
    stage stages[MAX_STAGES];
    int n_stages;
    added_token *added;
    int n_added;
    /* per first byte, the added tokens of each group (0: not normalized, 1: normalized),
     * longest first: indices into added, -1 terminated lists in first_list */
    int32_t first_start[2][256];
    int32_t *first_list;
    pcre2_code *word_char; /* a word character, for single_word */
    pcre2_match_data *word_md;
    /* id -> the file's string and its decoded bytes; specials */
    uint32_t vocab_size;
    char **token_str;      /* NULL: no token with this id */
    uint32_t *dec_off, *dec_len;
    char *dec_bytes;
    unsigned char *special;
    id_map *names;         /* the file's strings -> id (vocabulary, then added tokens) */
    char *strings;         /* arena of token_str */
    size_t strings_used;
    byte_buf work;         /* pieces with a prefix space */
    int nfc;               /* the normalizer is NFC */
} hf_tokenizer;

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 prefix of s[0, n) (n when all of it is valid). */
static size_t utf8_valid_prefix(const unsigned char *s, size_t n) {
    size_t i = 0, k;
    while (i < n && (k = utf8_valid_len(s + i, n - i)) > 0) i += k;
    return i;
}

static size_t utf8_char_len(unsigned char c) {
    return c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
}

/* Unicode White_Space (Rust's char::is_whitespace, which lstrip/rstrip use) */
static int is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* ---- encode ---- */

/* Why an encode stopped (encoder.failed). */
enum { ENC_OK, ENC_OOM, ENC_TOO_LONG, ENC_PATTERN };

typedef struct encoder {
    hf_tokenizer *hf;
    token_ids *out;
    int failed;              /* ENC_* */
    const char *text;        /* the text encoded, text_n bytes */
    size_t text_n;
    const char *copy;        /* a piece copied with a prefix space (hf->work), copy_n bytes, */
    size_t copy_n;           /* of the text's piece at copy_of */
    const char *copy_of;
    size_t at;               /* the text's offset the failure is about */
    size_t piece_n;          /* ENC_TOO_LONG: the piece's bytes */
    int pcre_rc, stage;      /* ENC_PATTERN: PCRE2's error and the stage */
} encoder;

/* The offset in the text encoded of p, a piece of it or of the copy with a prefix space. */
static size_t text_offset(const encoder *e, const char *p) {
    if (p >= e->text && p <= e->text + e->text_n) return (size_t)(p - e->text);
    if (e->copy && p >= e->copy && p <= e->copy + e->copy_n)
        return (size_t)(e->copy_of - e->text) + (p > e->copy ? (size_t)(p - e->copy) - 1 : 0);
    return (size_t)-1;
}

static void run_stage(encoder *e, int k, const char *p, size_t n);

/* The pieces a split produces, fed one at a time with whether each is a match; the
 * behaviour decides what reaches the next stage (Hugging Face's SplitDelimiterBehavior,
 * streamed: at most one piece is held). */
typedef struct splitter {
    encoder *e;
    int next_stage;
    split_behavior behavior;
    const char *held;
    size_t held_n;
    int holding, prev_match;
} splitter;

static void emit(splitter *s, const char *p, size_t n) {
    if (n) run_stage(s->e, s->next_stage, p, n);
}

static void split_piece(splitter *s, const char *p, size_t n, int is_match) {
    switch (s->behavior) {
    case SPLIT_REMOVED:
        if (!is_match) emit(s, p, n);
        break;
    case SPLIT_ISOLATED:
        emit(s, p, n);
        break;
    case SPLIT_MERGED_WITH_PREVIOUS:
    case SPLIT_CONTIGUOUS: {
        int join = s->behavior == SPLIT_CONTIGUOUS ? is_match == s->prev_match
                                                   : is_match && !s->prev_match;
        if (join && s->holding) {
            s->held_n = (size_t)(p + n - s->held);
        } else {
            if (s->holding) emit(s, s->held, s->held_n);
            s->held = p, s->held_n = n, s->holding = 1;
        }
        s->prev_match = is_match;
        break;
    }
    case SPLIT_MERGED_WITH_NEXT:
        /* a match joins the piece after it when that one is not a match */
        if (s->holding && !is_match) {
            emit(s, s->held, (size_t)(p + n - s->held));
            s->holding = 0;
        } else {
            if (s->holding) emit(s, s->held, s->held_n);
            s->holding = is_match;
            if (is_match)
                s->held = p, s->held_n = n;
            else
                emit(s, p, n);
        }
        break;
    }
}

static void split_end(splitter *s) {
    if (s->holding) emit(s, s->held, s->held_n);
    s->holding = 0;
}

static void run_stage(encoder *e, int k, const char *p, size_t n) {
    hf_tokenizer *hf = e->hf;
    if (e->failed) return;
    if (k == hf->n_stages) {
        if (n > TOKENIZER_MAX_PIECE) {
            e->failed = ENC_TOO_LONG;
            e->at = text_offset(e, p);
            e->piece_n = n;
        } else if (bpe_encode_word(hf->model, (const unsigned char *)p, n, e->out) != 0) {
            e->failed = ENC_OOM;
        }
        return;
    }
    stage *st = &hf->stages[k];
    if (st->add_prefix_space && p[0] != ' ') {
        /* room was reserved for every piece's copy: no reallocation under p */
        char *copy = hf->work.data + hf->work.n;
        copy[0] = ' ';
        memcpy(copy + 1, p, n);
        hf->work.n += n + 1;
        e->copy = copy, e->copy_n = n + 1, e->copy_of = p;
        p = copy;
        n++;
    }
    if (!st->re) {
        run_stage(e, k + 1, p, n);
        return;
    }
    splitter s = {.e = e, .next_stage = k + 1, .behavior = st->behavior};
    size_t at = 0, prev = 0;
    const unsigned char *subject = (const unsigned char *)p;
    while (at <= n && !e->failed) {
        int rc = st->jit ? pcre2_jit_match(st->re, subject, n, at, PCRE2_NO_UTF_CHECK, st->md, NULL)
                         : pcre2_match(st->re, subject, n, at, PCRE2_NO_UTF_CHECK, st->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        /* PCRE2's match limit or JIT stack: the piece cannot be split as the pattern says
         * (tokenizers' Oniguruma stops with an error there too: its retry limit) */
        if (rc < 0) {
            e->failed = ENC_PATTERN;
            e->pcre_rc = rc;
            e->stage = k;
            e->at = text_offset(e, p);
            return;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        size_t ms = ov[0], me = ov[1];
        if (ms > prev) split_piece(&s, p + prev, ms - prev, st->invert);
        split_piece(&s, p + ms, me - ms, !st->invert);
        prev = me;
        at = me > ms ? me : me + (me < n ? utf8_char_len(subject[me]) : 1);
    }
    if (prev < n) split_piece(&s, p + prev, n - prev, st->invert);
    split_end(&s);
}

/* Whether the character ending at text[at) / starting at text[at] is a word character. */
static int word_char_at(hf_tokenizer *hf, const char *text, size_t end, size_t at) {
    return pcre2_match(hf->word_char, (PCRE2_SPTR)text, end, at,
                       PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, hf->word_md, NULL) >= 0;
}

static void split_added(encoder *e, int group, const char *text, size_t n);

/* A piece between the added tokens that are not normalized: the normalizer's output (NFC
 * composes; ASCII is its own NFC), then the normalized added tokens and the pre-tokenizer. */
static void normalized_piece(encoder *e, const char *p, size_t n) {
    hf_tokenizer *hf = e->hf;
    size_t k = 0;
    while (hf->nfc && k < n && (unsigned char)p[k] < 0x80) k++;
    if (!hf->nfc || k == n) {
        split_added(e, 1, p, n);
        return;
    }
    utf8proc_uint8_t *nfc = NULL;
    const utf8proc_ssize_t len = utf8proc_map((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)n,
                                              &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    /* the text is valid UTF-8 (hf_encode checked): only memory can fail; the prefix-space
     * copies of the longer text need room in work, which holds nothing live here */
    if (len < 0 || byte_buf_reserve(&hf->work, hf->work.n + 2 * (size_t)len + 16) != 0)
        e->failed = 1;
    else
        split_added(e, 1, (const char *)nfc, (size_t)len);
    free(nfc);
}

/* Cuts the added tokens of `group` out of text[0, n): runs the pre-tokenizer on the
 * pieces between them (after the normalizer and the normalized group, when this is group
 * 0). */
static void split_added(encoder *e, int group, const char *text, size_t n) {
    hf_tokenizer *hf = e->hf;
    size_t done = 0; /* text[0, done) is handled */
    for (size_t i = 0; i < n && !e->failed;) {
        int32_t at = hf->first_start[group][(unsigned char)text[i]];
        const added_token *hit = NULL;
        for (; at >= 0 && hf->first_list[at] >= 0; at++) {
            const added_token *a = &hf->added[hf->first_list[at]];
            if (a->len <= n - i && memcmp(text + i, a->content, a->len) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t start = i, stop = i + hit->len;
        i = stop;
        if (hit->single_word) {
            size_t back = start;
            while (back > 0 && ((unsigned char)text[back - 1] & 0xC0) == 0x80) back--;
            int word_before = start > 0 && word_char_at(hf, text, start, back - 1);
            int word_after = stop < n && word_char_at(hf, text, n, stop);
            if (word_before || word_after) continue;
        }
        if (hit->lstrip) {
            size_t s = start;
            while (s > done) {
                size_t b = s - 1;
                while (b > done && ((unsigned char)text[b] & 0xC0) == 0x80) b--;
                size_t len;
                if (!is_white_space(utf8_decode((const unsigned char *)text + b, &len))) break;
                s = b;
            }
            start = s;
        }
        if (hit->rstrip) {
            size_t len;
            while (stop < n && is_white_space(utf8_decode((const unsigned char *)text + stop, &len)))
                stop += len;
            i = stop;
        }
        if (start > done) {
            if (group == 0)
                normalized_piece(e, text + done, start - done);
            else
                run_stage(e, 0, text + done, start - done);
        }
        if (token_ids_push(e->out, hit->id) != 0) e->failed = ENC_OOM;
        done = stop;
    }
    if (done < n && !e->failed) {
        if (group == 0)
            normalized_piece(e, text + done, n - done);
        else
            run_stage(e, 0, text + done, n - done);
    }
}

static int hf_encode(void *impl, const char *text, size_t len, token_ids *out, size_t *at,
                     char *err, size_t errlen) {
    hf_tokenizer *hf = impl;
    size_t valid = utf8_valid_prefix((const unsigned char *)text, len);
    if (valid < len) {
        *at = valid;
        tokenizer_set_err(err, errlen, "%s: invalid UTF-8: a tokenizer.json tokenizer takes "
                          "Unicode text only", hf->path);
        return -1;
    }
    /* every piece may get a prefix space: at most one byte per input byte, plus one */
    hf->work.n = 0;
    if (byte_buf_reserve(&hf->work, 2 * len + 16) != 0) {
        tokenizer_set_err(err, errlen, "%s: out of memory", hf->path);
        return -1;
    }
    encoder e = {.hf = hf, .out = out, .text = text, .text_n = len};
    split_added(&e, 0, text, len);
    if (e.failed == ENC_TOO_LONG) {
        *at = e.at;
        tokenizer_set_err(err, errlen, "%s: a pre-token (a piece encoded whole) of %zu bytes, "
                          "more than the %d a tokenizer encodes at once (its memory grows with "
                          "the piece)", hf->path, e.piece_n, TOKENIZER_MAX_PIECE);
    } else if (e.failed == ENC_PATTERN) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(e.pcre_rc, msg, sizeof msg);
        *at = e.at;
        tokenizer_set_err(err, errlen, "%s: pre-tokenizer %d's pattern cannot split a piece "
                          "of the text (PCRE2: %s)", hf->path, e.stage + 1, (const char *)msg);
    } else if (e.failed) {
        tokenizer_set_err(err, errlen, "%s: out of memory", hf->path);
    }
    return e.failed ? -1 : 0;
}

static int hf_decode(void *impl, const int32_t *ids, size_t n, int skip_special, byte_buf *out,
                     char *err, size_t errlen) {
    hf_tokenizer *hf = impl;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (!hf->token_str[id]) {
            tokenizer_set_err(err, errlen, "%s: token id %ld has no token", hf->path, (long)id);
            return -1;
        }
        if (skip_special && hf->special[id]) continue;
        if (byte_buf_append(out, hf->dec_bytes + hf->dec_off[id], hf->dec_len[id]) != 0) {
            tokenizer_set_err(err, errlen, "%s: out of memory", hf->path);
            return -1;
        }
    }
    return 0;
}

static int32_t hf_token_id(const void *impl, const char *s) {
    const hf_tokenizer *hf = impl;
    return id_map_get(hf->names, s, strlen(s));
}

static const char *hf_token_string(const void *impl, int32_t id) {
    return ((const hf_tokenizer *)impl)->token_str[id];
}

static int hf_is_special(const void *impl, int32_t id) {
    return ((const hf_tokenizer *)impl)->special[id];
}

static const char *hf_encoder(const void *impl) {
    return "added tokens, pre-tokenizer (PCRE2), byte-level BPE in C";
}

static void hf_free(void *impl) {
    hf_tokenizer *hf = impl;
    bpe_free(hf->model);
    for (int i = 0; i < hf->n_stages; i++) {
        pcre2_code_free(hf->stages[i].re);
        pcre2_match_data_free(hf->stages[i].md);
    }
    pcre2_code_free(hf->word_char);
    pcre2_match_data_free(hf->word_md);
    free(hf->added);
    free(hf->first_list);
    free(hf->token_str);
    free(hf->dec_off);
    free(hf->dec_len);
    free(hf->dec_bytes);
    free(hf->special);
    id_map_free(hf->names);
    free(hf->strings);
    free(hf->work.data);
    free(hf);
}

static const tokenizer_ops hf_ops = {
    .kind = "hf-bpe",
    .encode = hf_encode,
    .decode = hf_decode,
    .token_id = hf_token_id,
    .token_string = hf_token_string,
    .is_special = hf_is_special,
    .encoder = hf_encoder,
    .free = hf_free,
};

/* ---- loading ---- */

typedef struct loader {
    hf_tokenizer *hf;
    char *err;
    size_t errlen;
    int byte_level; /* a ByteLevel pre-tokenizer was read */
} loader;

static int fail(loader *ld, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(loader *ld, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tokenizer_set_err(ld->err, ld->errlen, "%s: %s", ld->hf->path, msg);
    return -1;
}

static const char *type_of(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* A boolean member; absent or null -> def. */
static int flag(const cJSON *o, const char *key, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* A pattern with \s and \S as Oniguruma (the tokenizers library's engine) means them: the
 * White_Space property. PCRE2's \s also takes U+180E, which Unicode 6.3 moved out of it.
 * Escapes are copied in pairs, \Q...\E sections as they are. NULL when out of memory. */
static char *onig_spaces(const char *p, size_t n, size_t *out_n) {
    char *q = malloc(8 * n + 1);
    if (!q) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\\' || i + 1 == n) {
            q[k++] = p[i];
        } else if (p[i + 1] == 's' || p[i + 1] == 'S') {
            k += (size_t)sprintf(q + k, "\\%c{White_Space}", p[i + 1] == 's' ? 'p' : 'P');
            i++;
        } else if (p[i + 1] == 'Q') {
            const char *e = memmem(p + i, n - i, "\\E", 2);
            size_t stop = e ? (size_t)(e - p) + 2 : n;
            memcpy(q + k, p + i, stop - i);
            k += stop - i;
            i = stop - 1;
        } else {
            q[k++] = p[i];
            q[k++] = p[++i];
        }
    }
    *out_n = k;
    return q;
}

static int add_stage(loader *ld, const char *pattern, size_t len, split_behavior behavior,
                     int invert, int add_prefix_space, const char *what) {
    hf_tokenizer *hf = ld->hf;
    if (hf->n_stages == MAX_STAGES) return fail(ld, "more than %d pre-tokenizers", MAX_STAGES);
    stage *st = &hf->stages[hf->n_stages++];
    *st = (stage){.behavior = behavior, .invert = invert, .add_prefix_space = add_prefix_space};
    if (!pattern) return 0;
    int code;
    PCRE2_SIZE at;
    size_t n;
    char *onig = onig_spaces(pattern, len, &n);
    if (!onig) return fail(ld, "out of memory");
    st->re = pcre2_compile((PCRE2_SPTR)onig, n, PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
    free(onig);
    if (!st->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return fail(ld, "%s: pattern does not compile with PCRE2 at offset %zu: %s", what,
                    (size_t)at, (const char *)msg);
    }
    st->jit = pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE) == 0;
    st->md = pcre2_match_data_create_from_pattern(st->re, NULL);
    return st->md ? 0 : fail(ld, "out of memory");
}

/* A literal as a PCRE2 pattern (\Q...\E cannot hold "\E": quote byte by byte instead). */
static char *quote_literal(const char *s, size_t n, size_t *out_n) {
    char *q = malloc(2 * n + 1);
    if (!q) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (strchr("\\^$.|?*+()[]{}", s[i]) && s[i]) q[k++] = '\\';
        q[k++] = s[i];
    }
    *out_n = k;
    return q;
}

static int load_pre_tokenizer(loader *ld, const cJSON *p, int last) {
    const char *type = type_of(p);
    if (!type) return fail(ld, "pre_tokenizer without a \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list)) return fail(ld, "Sequence pre_tokenizer without a list");
        for (const cJSON *c = list->child; c; c = c->next)
            if (load_pre_tokenizer(ld, c, last && !c->next) != 0) return -1;
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        if (!last) return fail(ld, "a ByteLevel pre-tokenizer must come last");
        ld->byte_level = 1;
        int regex = flag(p, "use_regex", 1);
        return add_stage(ld, regex ? gpt2_pattern : NULL, regex ? strlen(gpt2_pattern) : 0,
                         SPLIT_ISOLATED, 0, flag(p, "add_prefix_space", 1), "ByteLevel");
    }
    if (strcmp(type, "Digits") == 0) {
        /* Rust's char::is_numeric: the N categories */
        return add_stage(ld, "\\p{N}", 5,
                         flag(p, "individual_digits", 0) ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, 0,
                         0, "Digits");
    }
    if (strcmp(type, "Split") == 0) {
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                            "MergedWithNext", "Contiguous"};
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        int behavior = -1;
        for (int i = 0; cJSON_IsString(beh) && i < 5; i++)
            if (strcmp(beh->valuestring, names[i]) == 0) behavior = i;
        if (behavior < 0) return fail(ld, "Split pre-tokenizer: unknown \"behavior\"");
        if (cJSON_IsString(re))
            return add_stage(ld, re->valuestring, strlen(re->valuestring),
                             (split_behavior)behavior, flag(p, "invert", 0), 0, "Split");
        if (!cJSON_IsString(str))
            return fail(ld, "Split pre-tokenizer: \"pattern\" must be {\"Regex\"} or {\"String\"}");
        size_t qn;
        char *q = quote_literal(str->valuestring, strlen(str->valuestring), &qn);
        if (!q) return fail(ld, "out of memory");
        int rc = add_stage(ld, q, qn, (split_behavior)behavior, flag(p, "invert", 0), 0, "Split");
        free(q);
        return rc;
    }
    return fail(ld, "pre-tokenizer \"%s\" is not supported (supported: ByteLevel, Split, Digits, "
                "Sequence)", type);
}

/* Records id -> string (the file's; the arena was sized for every vocabulary entry and
 * every added token). */
static void set_token(hf_tokenizer *hf, int32_t id, const char *s) {
    size_t len = strlen(s);
    hf->token_str[id] = hf->strings + hf->strings_used;
    memcpy(hf->token_str[id], s, len + 1);
    hf->strings_used += len + 1;
}

/* A token id: an integer in [0, 2^24) (larger vocabularies do not exist; the bound keeps a
 * corrupt file from sizing tables). */
enum { MAX_TOKEN_ID = (1 << 24) - 1 };

/* NULL when v is a token id, else what is wrong with it (into buf). */
static const char *id_problem(const cJSON *v, char *buf, size_t len) {
    if (!v) return "no \"id\"";
    if (!cJSON_IsNumber(v)) return "an \"id\" that is not a number";
    const double d = v->valuedouble;
    if (d != floor(d)) snprintf(buf, len, "id %g, not an integer", d);
    else if (d < 0 || d > MAX_TOKEN_ID)
        snprintf(buf, len, "id %.17g, outside [0, %d] (the ids a tokenizer may have)", d,
                 MAX_TOKEN_ID);
    else return NULL;
    return buf;
}

static int load_model(loader *ld, const cJSON *model, const cJSON *added) {
    hf_tokenizer *hf = ld->hf;
    const char *type = type_of(model);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (type && strcmp(type, "BPE") != 0)
        return fail(ld, "model type \"%s\" is not supported (only byte-level BPE)", type);
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return fail(ld, "the BPE model needs a \"vocab\" object and a \"merges\" list");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble != 0)
        return fail(ld, "BPE dropout is not supported");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(model, affixes[i]);
        if (cJSON_IsString(a) && a->valuestring[0])
            return fail(ld, "BPE %s is not supported (byte-level BPE has none)", affixes[i]);
    }
    if (flag(model, "byte_fallback", 0))
        return fail(ld, "BPE byte_fallback is not supported: a SentencePiece-style tokenizer.json; "
                    "use the model's tokenizer.model");

    /* ids: the largest of vocabulary and added tokens sets the size */
    double max_id = -1;
    size_t chars = 0;
    char why[96];
    for (const cJSON *v = vocab->child; v; v = v->next) {
        const char *bad = id_problem(v, why, sizeof why);
        if (bad) return fail(ld, "vocab entry \"%.60s\": %s", v->string, bad);
        if (v->valuedouble > max_id) max_id = v->valuedouble;
        chars += strlen(v->string) + 1;
    }
    int k = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, k++) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!cJSON_IsString(content) || !content->valuestring[0])
            return fail(ld, "added_tokens entry %d: no non-empty \"content\"", k);
        const char *bad = id_problem(id, why, sizeof why);
        if (bad)
            return fail(ld, "added_tokens entry %d (\"%.60s\"): %s", k, content->valuestring,
                        bad);
        if (id->valuedouble > max_id) max_id = id->valuedouble;
        chars += strlen(content->valuestring) + 1;
    }
    if (max_id < 0) return fail(ld, "empty vocabulary");
    hf->vocab_size = (uint32_t)max_id + 1;
    hf->token_str = calloc(hf->vocab_size, sizeof *hf->token_str);
    hf->special = calloc(hf->vocab_size, 1);
    hf->strings = malloc(chars);
    hf->names = id_map_create();
    hf->model = bpe_create();
    if (!hf->token_str || !hf->special || !hf->strings || !hf->names || !hf->model)
        return fail(ld, "out of memory");

    unsigned char *raw = malloc(1 << 16);
    if (!raw) return fail(ld, "out of memory");
    int rc = 0;
    for (const cJSON *v = vocab->child; v && rc == 0; v = v->next) {
        int32_t id = (int32_t)v->valuedouble;
        if (hf->token_str[id]) {
            rc = fail(ld, "vocab id %ld is given twice", (long)id);
            break;
        }
        set_token(hf, id, v->string);
        size_t len = strlen(v->string), n;
        /* names: the model's vocabulary while merges are read (load_added adds the added
         * tokens ahead of it); an entry outside the byte-level alphabet cannot come out of
         * the merges */
        if (id_map_add(hf->names, v->string, len, id) < 0 ||
            (len < (1 << 16) && bpe_bytelevel_to_bytes(v->string, len, raw, &n) == 0 &&
             bpe_add_token(hf->model, id, raw, n) < 0))
            rc = fail(ld, "out of memory");
    }
    free(raw);
    if (rc != 0) return -1;

    /* merges: "a b" strings or [a, b] pairs, ranked in order */
    int rank = 0;
    if (cJSON_GetArraySize(merges) >= (1 << 24)) return fail(ld, "more than 2^24 merges");
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *a, *b;
        size_t la, lb;
        char both[1024];
        if (cJSON_IsString(m)) {
            const char *sp = strchr(m->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return fail(ld, "merge %d \"%.60s\" is not two tokens separated by a space", rank,
                            m->valuestring);
            a = m->valuestring, la = (size_t)(sp - a), b = sp + 1, lb = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            a = m->child->valuestring, la = strlen(a);
            b = m->child->next->valuestring, lb = strlen(b);
        } else {
            return fail(ld, "merge %d is neither \"a b\" nor [\"a\", \"b\"]", rank);
        }
        if (la + lb >= sizeof both) return fail(ld, "merge %d is too long", rank);
        memcpy(both, a, la);
        memcpy(both + la, b, lb);
        int32_t ia = id_map_get(hf->names, a, la), ib = id_map_get(hf->names, b, lb);
        int32_t iab = id_map_get(hf->names, both, la + lb);
        if (ia < 0 || ib < 0 || iab < 0)
            return fail(ld, "merge %d \"%.*s\" + \"%.*s\": %s is not in the vocabulary", rank,
                        (int)(la < 60 ? la : 60), a, (int)(lb < 60 ? lb : 60), b,
                        ia < 0 ? "the first" : ib < 0 ? "the second" : "the merged token");
        if (bpe_add_merge(hf->model, ia, ib, iab) != 0) return fail(ld, "out of memory");
    }

    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    int32_t unk_id = -1;
    if (cJSON_IsString(unk)) {
        unk_id = id_map_get(hf->names, unk->valuestring, strlen(unk->valuestring));
        if (unk_id < 0) return fail(ld, "unk_token \"%.60s\" is not in the vocabulary", unk->valuestring);
    }
    bpe_set_options(hf->model, flag(model, "ignore_merges", 0), unk_id, flag(model, "fuse_unk", 0));
    return 0;
}

/* Added tokens (their content wins over a vocabulary entry's string for the same id, and
 * over the vocabulary when looked up by string, as in tokenizers), and the first-byte
 * index that finds them in a text. */
static int load_added(loader *ld, const cJSON *added, const cJSON *vocab) {
    hf_tokenizer *hf = ld->hf;
    int n = added ? cJSON_GetArraySize(added) : 0;
    hf->added = calloc((size_t)n + 1, sizeof *hf->added);
    /* every token once, and a -1 after each list: at most 2n + 1 entries */
    hf->first_list = malloc((2 * (size_t)n + 1) * sizeof *hf->first_list);
    id_map *names = id_map_create();
    if (!hf->added || !hf->first_list || !names) {
        id_map_free(names);
        return fail(ld, "out of memory");
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        added_token *t = &hf->added[hf->n_added++];
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        t->id = (int32_t)cJSON_GetObjectItemCaseSensitive(a, "id")->valuedouble;
        t->special = flag(a, "special", 0);
        t->lstrip = flag(a, "lstrip", 0);
        t->rstrip = flag(a, "rstrip", 0);
        t->single_word = flag(a, "single_word", 0);
        t->normalized = flag(a, "normalized", !t->special);
        if (!hf->token_str[t->id] || strcmp(hf->token_str[t->id], content->valuestring) != 0)
            set_token(hf, t->id, content->valuestring);
        t->content = hf->token_str[t->id];
        t->len = strlen(t->content);
        hf->special[t->id] = (unsigned char)t->special;
        if (id_map_add(names, t->content, t->len, t->id) < 0) {
            id_map_free(names);
            return fail(ld, "out of memory");
        }
    }
    for (const cJSON *v = vocab->child; v; v = v->next)
        if (id_map_add(names, v->string, strlen(v->string), (int32_t)v->valuedouble) < 0) {
            id_map_free(names);
            return fail(ld, "out of memory");
        }
    id_map_free(hf->names);
    hf->names = names;
    /* per group and first byte, the tokens longest first (leftmost-longest matching) */
    int32_t k = 0;
    for (int g = 0; g < 2; g++)
        for (int c = 0; c < 256; c++) {
            hf->first_start[g][c] = -1;
            int32_t begin = k;
            for (int i = 0; i < hf->n_added; i++)
                if (hf->added[i].normalized == g && (unsigned char)hf->added[i].content[0] == c)
                    hf->first_list[k++] = i;
            if (k == begin) continue;
            for (int32_t x = begin + 1; x < k; x++) /* insertion sort by length, descending */
                for (int32_t y = x; y > begin && hf->added[hf->first_list[y]].len >
                                                     hf->added[hf->first_list[y - 1]].len; y--) {
                    int32_t tmp = hf->first_list[y];
                    hf->first_list[y] = hf->first_list[y - 1];
                    hf->first_list[y - 1] = tmp;
                }
            hf->first_list[k++] = -1;
            hf->first_start[g][c] = begin;
        }
    int code;
    PCRE2_SIZE at;
    /* Rust regex's \w (what tokenizers' single_word tests), not PCRE2's \p{L}\p{N}_ */
    static const char word[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
    hf->word_char =
        pcre2_compile((PCRE2_SPTR)word, sizeof word - 1, PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
    hf->word_md = hf->word_char ? pcre2_match_data_create_from_pattern(hf->word_char, NULL) : NULL;
    return hf->word_md ? 0 : fail(ld, "out of memory");
}

/* id -> the bytes decode writes: the ByteLevel decoder maps a token's characters back to
 * bytes, or keeps the token's own UTF-8 when a character is outside the alphabet. */
static int build_decode_table(loader *ld) {
    hf_tokenizer *hf = ld->hf;
    size_t total = 0;
    for (uint32_t i = 0; i < hf->vocab_size; i++)
        if (hf->token_str[i]) total += strlen(hf->token_str[i]);
    hf->dec_off = calloc(hf->vocab_size, sizeof *hf->dec_off);
    hf->dec_len = calloc(hf->vocab_size, sizeof *hf->dec_len);
    hf->dec_bytes = malloc(total + 1);
    if (!hf->dec_off || !hf->dec_len || !hf->dec_bytes) return fail(ld, "out of memory");
    size_t at = 0;
    for (uint32_t i = 0; i < hf->vocab_size; i++) {
        const char *s = hf->token_str[i];
        if (!s) continue;
        size_t len = strlen(s), n;
        hf->dec_off[i] = (uint32_t)at;
        if (bpe_bytelevel_to_bytes(s, len, (unsigned char *)hf->dec_bytes + at, &n) != 0) {
            memcpy(hf->dec_bytes + at, s, len);
            n = len;
        }
        hf->dec_len[i] = (uint32_t)n;
        at += n;
    }
    return 0;
}

/* The post-processor's single-sequence template: the special token before $A is the bos
 * added to a text, the one after it the eos. */
static int load_post_processor(loader *ld, const cJSON *pp, tokenizer_file_specials *f) {
    if (!pp || cJSON_IsNull(pp)) return 0;
    const char *type = type_of(pp);
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pp, "processors");
        for (const cJSON *c = cJSON_IsArray(list) ? list->child : NULL; c; c = c->next)
            if (load_post_processor(ld, c, f) != 0) return -1;
        return 0;
    }
    if (type && strcmp(type, "ByteLevel") == 0) return 0;
    if (!type || strcmp(type, "TemplateProcessing") != 0)
        return fail(ld, "post_processor \"%s\" is not supported (TemplateProcessing, ByteLevel, "
                    "Sequence)", type ? type : "?");
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(pp, "special_tokens");
    int seen_a = 0;
    for (const cJSON *item = cJSON_IsArray(single) ? single->child : NULL; item; item = item->next) {
        if (cJSON_GetObjectItemCaseSensitive(item, "Sequence")) {
            seen_a = 1;
            continue;
        }
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
        const cJSON *entry = cJSON_IsString(name)
                                 ? cJSON_GetObjectItemCaseSensitive(specials, name->valuestring)
                                 : NULL;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids");
        if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) != 1 || !cJSON_IsNumber(ids->child))
            return fail(ld, "TemplateProcessing: each special token of \"single\" must have one id");
        int32_t id = (int32_t)ids->child->valuedouble;
        if (id < 0 || (uint32_t)id >= ld->hf->vocab_size)
            return fail(ld, "TemplateProcessing: id %ld is outside the vocabulary", (long)id);
        if (!seen_a) {
            if (f->add_bos) return fail(ld, "TemplateProcessing: more than one token before $A");
            f->bos = id, f->add_bos = 1;
        } else {
            if (f->add_eos) return fail(ld, "TemplateProcessing: more than one token after $A");
            f->eos = id, f->add_eos = 1;
        }
    }
    return 0;
}

static int load(loader *ld, const cJSON *root, tokenizer *t) {
    if (!cJSON_IsObject(root)) return fail(ld, "valid JSON but not an object");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        /* NFC, or a Sequence of NFCs only (an empty one: no normalizer) */
        const char *type = type_of(norm);
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers"), *one;
        int ok = type && strcmp(type, "NFC") == 0;
        ld->hf->nfc = ok;
        if (type && strcmp(type, "Sequence") == 0 && cJSON_IsArray(list)) {
            ok = 1;
            cJSON_ArrayForEach(one, list) {
                type = type_of(one);
                if (!type || strcmp(type, "NFC") != 0) {
                    ok = 0;
                    break;
                }
                ld->hf->nfc = 1;
            }
        }
        if (!ok)
            return fail(ld, "normalizer \"%s\" is not supported (byte-level BPE tokenizers have "
                        "none or NFC)", type ? type : "?");
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return fail(ld, "no \"model\" object");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return fail(ld, "\"added_tokens\" must be a list");
    if (!cJSON_IsArray(added)) added = NULL;
    if (load_model(ld, model, added) != 0 ||
        load_added(ld, added, cJSON_GetObjectItemCaseSensitive(model, "vocab")) != 0)
        return -1;

    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (!pre || cJSON_IsNull(pre)) return fail(ld, "no pre_tokenizer: not a byte-level BPE");
    if (load_pre_tokenizer(ld, pre, 1) != 0) return -1;
    if (!ld->byte_level) return fail(ld, "the pre_tokenizer has no ByteLevel: not a byte-level BPE");
    const char *dtype = dec && !cJSON_IsNull(dec) ? type_of(dec) : NULL;
    if (!dtype || strcmp(dtype, "ByteLevel") != 0)
        return fail(ld, "decoder \"%s\" is not supported (ByteLevel)", dtype ? dtype : "none");
    if (build_decode_table(ld) != 0) return -1;
    return load_post_processor(ld, cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                               &t->file);
}

int tokenizer_hf_open(tokenizer *t, const char *path, char *err, size_t errlen) {
    hf_tokenizer *hf = calloc(1, sizeof *hf);
    if (!hf) {
        tokenizer_set_err(err, errlen, "%s: out of memory", path);
        return -1;
    }
    snprintf(hf->path, sizeof hf->path, "%s", path);
    t->ops = &hf_ops;
    t->impl = hf;
    size_t len;
    char *text = tokenizer_read_file(path, &len, err, errlen);
    if (!text) return -1;
    cJSON *root = json_text_parse_file(path, text, len, 0, err, errlen);
    free(text);
    if (!root) return -1;
    loader ld = {hf, err, errlen, 0};
    int rc = load(&ld, root, t);
    cJSON_Delete(root);
    if (rc != 0) return -1;
    t->vocab_size = hf->vocab_size;
    return 0;
}
