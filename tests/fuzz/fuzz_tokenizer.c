/* Fuzzes the tokenizer readers (src/tokenizer/tokenizer.c tokenizer_open on a model directory: the
 * Hugging Face tokenizer.json of src/tokenizer/tokenizer_hf.c and src/tokenizer/bpe.c with its PCRE2
 * pre-tokenizer, the SentencePiece tokenizer.model of src/tokenizer/tokenizer_sp.cc and src/tokenizer/sp_bpe.c,
 * and the special tokens and chat template of src/tokenizer/tokenizer_specials.c). Input: the first
 * byte B picks one file of a small valid model directory and the rest of the input is that
 * file; the other files are the templates LLVMFuzzerInitialize makes:
 *   B % 7:  0 tokenizer.json  1 tokenizer_config.json  2 special_tokens_map.json
 *           3 generation_config.json  4 config.json  5 tokenizer.model
 *           6 chat_template.jinja
 *   B & 8:  the directory's tokenizer is the SentencePiece template (tokenizer.model),
 *           else the Hugging Face one (tokenizer.json); 0 and 5 pick their own kind
 * A directory that opens must encode a fixed text (ASCII, UTF-8 of 2, 3 and 4 bytes, the
 * special tokens' strings) into ids in [0, vocab), decode them, decode them one at a time
 * to the same text (tokenizer_stream), and refuse an id outside the vocabulary; every
 * failure, of the open or after it, is one line naming a file of the directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz.h"

enum { F_HF, F_TOKENIZER_CONFIG, F_SPECIAL_MAP, F_GENERATION, F_CONFIG, F_SP, F_TEMPLATE, F_N };
static const char *const file_names[F_N] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "generation_config.json", "config.json", "tokenizer.model", "chat_template.jinja"};

/* a byte-level BPE over a b Ġ (space) with merges (a b), (Ġ ab); <s> and </s> added, as
 * tests/tokenizer_errors.sh's */
static const char hf_json[] =
    "{\"version\": \"1.0\",\n"
    " \"added_tokens\": [\n"
    "  {\"id\": 5, \"content\": \"<s>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false,"
    " \"normalized\": false, \"special\": true},\n"
    "  {\"id\": 6, \"content\": \"</s>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false,"
    " \"normalized\": false, \"special\": true}],\n"
    " \"normalizer\": null,\n"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true},\n"
    " \"post_processor\": {\"type\": \"TemplateProcessing\",\n"
    "  \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],\n"
    "  \"pair\": [], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [5], \"tokens\": [\"<s>\"]}}},\n"
    " \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n"
    " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null,\n"
    "  \"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false,\n"
    "  \"vocab\": {\"a\": 0, \"b\": 1, \"\\u0120\": 2, \"ab\": 3, \"\\u0120ab\": 4, \"<s>\": 5, \"</s>\": 6},\n"
    "  \"merges\": [\"a b\", \"\\u0120 ab\"]}}\n";

static const char tokenizer_config[] =
    "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\"}, \"add_bos_token\": true,\n"
    " \"add_eos_token\": false, \"pad_token\": null,\n"
    " \"chat_template\": \"{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}\"}\n";
static const char special_map[] = "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}\n";
static const char chat_template[] = "{% for m in messages %}{{ m['content'] }}{% endfor %}\n";

/* the fixed text: ASCII, UTF-8 of 2, 3 and 4 bytes, the special tokens' strings */
static const char text[] = "ab ab a b<s>ba </s> \xc3\xa9t\xc3\xa9 \xe2\x96\x81\xe6\x97\xa5 "
                           "\xf0\x9f\x98\x80!\n\tab";

/* ---- a SentencePiece BPE model, as protobuf (sentencepiece_model.proto) ---- */

typedef struct proto {
    unsigned char *p;
    size_t n, cap;
} proto;

static void put(proto *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = 2 * (b->n + n);
        b->p = realloc(b->p, b->cap);
        if (!b->p) fuzz_fail("fuzz_tokenizer set-up", "out of memory");
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_varint(proto *b, uint64_t v) {
    unsigned char c;
    do {
        c = (unsigned char)(v & 0x7F) | (v > 0x7F ? 0x80 : 0);
        put(b, &c, 1);
        v >>= 7;
    } while (v);
}

static void put_int(proto *b, int field, uint64_t v) {
    put_varint(b, (uint64_t)field << 3);
    put_varint(b, v);
}

static void put_bytes(proto *b, int field, const void *data, size_t n) {
    put_varint(b, (uint64_t)field << 3 | 2);
    put_varint(b, n);
    put(b, data, n);
}

static void put_piece(proto *model, const char *piece, float score, int type) {
    proto p = {0};
    put_bytes(&p, 1, piece, strlen(piece));
    put_varint(&p, 2 << 3 | 5);
    put(&p, &score, 4); /* little-endian float: the machines this runs on */
    put_int(&p, 3, (uint64_t)type);
    put_bytes(model, 1, p.p, p.n);
    free(p.p);
}

/* <unk> <s> </s>, the 256 byte pieces, and ▁ a b ab ▁a ▁ab ▁b é: BPE, byte fallback, the
 * identity normaliser with the dummy prefix (the Llama-2 layout, which src/tokenizer/sp_bpe.c
 * encodes) */
static proto sp_model(void) {
    enum { NORMAL = 1, UNKNOWN = 2, CONTROL = 3, BYTE = 6 };
    proto m = {0};
    put_piece(&m, "<unk>", 0, UNKNOWN);
    put_piece(&m, "<s>", 0, CONTROL);
    put_piece(&m, "</s>", 0, CONTROL);
    for (int i = 0; i < 256; i++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", i);
        put_piece(&m, s, 0, BYTE);
    }
    static const char *const normal[] = {"\xe2\x96\x81", "a", "b", "ab", "\xe2\x96\x81" "a",
                                         "\xe2\x96\x81" "ab", "\xe2\x96\x81" "b", "\xc3\xa9"};
    for (int i = 0; i < 8; i++) put_piece(&m, normal[i], -(float)i, NORMAL);
    proto trainer = {0};
    put_int(&trainer, 3, 2);        /* model_type BPE */
    put_int(&trainer, 4, 259 + 8);  /* vocab_size */
    put_int(&trainer, 35, 1);       /* byte_fallback */
    put_int(&trainer, 40, 0);       /* unk_id */
    put_int(&trainer, 41, 1);       /* bos_id */
    put_int(&trainer, 42, 2);       /* eos_id */
    put_int(&trainer, 43, (uint64_t)-1); /* pad_id: none */
    put_bytes(&m, 2, trainer.p, trainer.n);
    proto norm = {0};
    put_bytes(&norm, 1, "identity", 8);
    put_int(&norm, 3, 1); /* add_dummy_prefix */
    put_int(&norm, 4, 0); /* remove_extra_whitespaces */
    put_int(&norm, 5, 1); /* escape_whitespaces */
    put_bytes(&m, 3, norm.p, norm.n);
    free(trainer.p);
    free(norm.p);
    return m;
}

static const void *tmpl[2][F_N]; /* [sp][file], NULL: absent */
static size_t tmpl_size[2][F_N];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static proto sp;
    sp = sp_model();
    static char gen[2][128], cfg[2][128];
    for (int s = 0; s < 2; s++) {
        /* the eos ids: </s> (6 in the HF template, 2 in the SentencePiece one) and <s> */
        snprintf(gen[s], sizeof gen[s], "{\"bos_token_id\": %d, \"eos_token_id\": [%d, %d]}\n",
                 s ? 1 : 5, s ? 2 : 6, s ? 1 : 5);
        snprintf(cfg[s], sizeof cfg[s], "{\"bos_token_id\": %d, \"eos_token_id\": %d, "
                 "\"vocab_size\": %d}\n", s ? 1 : 5, s ? 2 : 6, s ? 267 : 7);
        const void *files[F_N] = {s ? NULL : hf_json, tokenizer_config, special_map, gen[s],
                                  cfg[s], s ? sp.p : NULL, chat_template};
        for (int f = 0; f < F_N; f++) {
            tmpl[s][f] = files[f];
            tmpl_size[s][f] = f == F_SP ? sp.n : files[f] ? strlen(files[f]) : 0;
        }
    }
    return 0;
}

static void check(int rc, const char *err, const char *what) {
    fuzz_check_error(rc, err, fuzz_dir(), what);
}

/* What the interface promises of a tokenizer that opened. */
static void exercise(tokenizer *t) {
    char err[1536] = "";
    const uint32_t vocab = tokenizer_vocab_size(t);
    if (vocab == 0) fuzz_fail("tokenizer_open", "a tokenizer with an empty vocabulary opened");
    int n_eos = 0;
    const int32_t *eos = tokenizer_eos_ids(t, &n_eos);
    const int32_t specials[3] = {tokenizer_bos(t), tokenizer_eos(t), tokenizer_pad(t)};
    for (int i = 0; i < 3; i++)
        if (specials[i] < -1 || specials[i] >= (int64_t)vocab)
            fuzz_fail("tokenizer_bos/eos/pad", "an id outside [-1, vocab)");
    for (int i = 0; i < n_eos; i++)
        if (eos[i] < 0 || eos[i] >= (int64_t)vocab)
            fuzz_fail("tokenizer_eos_ids", "an id outside the vocabulary");
    if ((n_eos > 0) != (specials[1] >= 0) || (n_eos > 0 && eos[0] != specials[1]))
        fuzz_fail("tokenizer_eos_ids", "the first is not tokenizer_eos()");
    if ((tokenizer_add_bos(t) && specials[0] < 0) || (tokenizer_add_eos(t) && specials[1] < 0))
        fuzz_fail("tokenizer_open", "add_bos/add_eos without the token");
    const char *tpl = tokenizer_chat_template(t);
    if (tpl && !tokenizer_chat_template_path(t)[0])
        fuzz_fail("tokenizer_chat_template", "a template without the file it came from");
    for (int32_t id = 0; id < (int32_t)vocab && id < 512; id++) {
        const char *s = tokenizer_token_string(t, id);
        if (s && tokenizer_token_id(t, s) < 0)
            fuzz_fail("tokenizer_token_id", "the string of an id is not found");
        (void)tokenizer_is_special(t, id);
    }

    token_ids ids = {0};
    byte_buf whole = {0}, streamed = {0};
    int rc = tokenizer_encode_with(t, text, sizeof text - 1, tokenizer_default_flags(t), &ids,
                                   err, sizeof err);
    check(rc, err, "tokenizer_encode_with");
    if (rc == 0) {
        for (size_t i = 0; i < ids.n; i++)
            if (ids.ids[i] < 0 || (uint32_t)ids.ids[i] >= vocab)
                fuzz_fail("tokenizer_encode", "an id outside [0, vocab)");
        for (int skip = 0; skip < 2; skip++) {
            const int flags = skip ? TOKENIZER_SKIP_SPECIAL : 0;
            whole.n = streamed.n = 0;
            rc = tokenizer_decode(t, ids.ids, ids.n, flags, &whole, err, sizeof err);
            check(rc, err, "tokenizer_decode");
            if (rc != 0) fuzz_fail("tokenizer_decode", "refused ids that encode made");
            tokenizer_stream s;
            tokenizer_stream_init(&s, flags);
            for (size_t i = 0; i < ids.n && rc == 0; i++)
                rc = tokenizer_stream_push(t, &s, ids.ids[i], &streamed, err, sizeof err);
            if (rc == 0) rc = tokenizer_stream_flush(t, &s, &streamed, err, sizeof err);
            tokenizer_stream_free(&s);
            check(rc, err, "tokenizer_stream");
            if (rc != 0) fuzz_fail("tokenizer_stream", "refused ids that decode took");
            if (streamed.n != whole.n || memcmp(streamed.data, whole.data, whole.n) != 0)
                fuzz_fail("tokenizer_stream", "the pieces do not add up to tokenizer_decode");
        }
    }
    const int32_t outside[2] = {0, (int32_t)vocab};
    err[0] = '\0';
    rc = tokenizer_decode(t, outside, 2, 0, &whole, err, sizeof err);
    if (rc == 0) fuzz_fail("tokenizer_decode", "took an id outside the vocabulary");
    check(rc, err, "tokenizer_decode of an id outside the vocabulary");
    free(ids.ids);
    free(whole.data);
    free(streamed.data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const int which = data[0] % F_N;
    const int sp = which == F_SP ? 1 : which == F_HF ? 0 : (data[0] & 8) != 0;
    char path[600];
    for (int f = 0; f < F_N; f++) {
        snprintf(path, sizeof path, "%s/%s", fuzz_dir(), file_names[f]);
        remove(path);
        if (f == which) fuzz_write(file_names[f], data + 1, size - 1);
        else if (tmpl[sp][f]) fuzz_write(file_names[f], tmpl[sp][f], tmpl_size[sp][f]);
    }
    tokenizer *t = NULL;
    char err[1536] = "";
    int rc = tokenizer_open(&t, fuzz_dir(), err, sizeof err);
    check(rc, err, "tokenizer_open");
    if (rc == 0) {
        exercise(t);
        tokenizer_free(t);
    }
    return 0;
}
