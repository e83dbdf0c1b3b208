// SentencePiece model files (tokenizer.model) through Debian's libsentencepiece (C++ API),
// behind the C table of src/tokenizer/tokenizer_impl.h: loading, piece lookups, decoding, and
// encoding wherever the shortcuts below are not exact.
//
// Speed: where it is exact, the text is cut into words and each word's ids are memoised
// (src/tokenizer/token_cache.h). It is exact when (a) the model is BPE with the identity normaliser,
// whitespace escaped to U+2581 and not collapsed, not treated as a suffix (Llama-2,
// Mistral, TinyLlama: read from the model's protobuf), and (b) no mergeable piece holds
// U+2581 after another character (checked over the vocabulary at load). Then no piece can
// span the boundary before a space that follows a character other than a space or U+2581
// (the escaped space itself, which the normaliser leaves as it is), BPE merges never cross
// it, and encoding the text is encoding each word: the first word as it is, every later
// one (which starts with a space) without one space, because the dummy prefix stands for
// it. Otherwise the whole text goes to the library in one call.
//
// Where, besides, the model has no user-defined or unused pieces, a word the memo does not
// hold is encoded by src/tokenizer/sp_bpe.c (the library's BPE in C over flat buffers) instead of a
// library call, which costs a normaliser pass, a std::vector and a heap of allocated pairs
// per word; tests/tokenizer_ref.sh holds the ids to python sentencepiece's.
#include <sentencepiece_processor.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "src/tokenizer/sp_bpe.h"
#include "src/tokenizer/token_cache.h"
#include "src/tokenizer/tokenizer_sp.h"

namespace {

struct sp_tokenizer {
    sentencepiece::SentencePieceProcessor proc;
    std::string path;
    bool by_words = false;       // the word-by-word path is exact (see the file comment)
    bool dummy_prefix = true;    // normalizer_spec.add_dummy_prefix
    token_cache *cache = nullptr;
    sp_bpe *native = nullptr;    // the C encoder of a word, where exact (see above)
    std::vector<int> scratch;    // one library call's ids
    std::vector<int> kept;       // decode: the ids that are not skipped
};

// ---- the few protobuf fields that decide whether words can be encoded alone ----

struct proto_reader {
    const unsigned char *p, *end;
    bool varint(uint64_t *v) {
        *v = 0;
        for (int shift = 0; p < end && shift < 64; shift += 7) {
            unsigned char b = *p++;
            *v |= (uint64_t)(b & 0x7F) << shift;
            if (!(b & 0x80)) return true;
        }
        return false;
    }
    // next field: number, wire type, and for length-delimited ones the bytes
    bool field(uint32_t *number, int *wire, uint64_t *value, proto_reader *sub) {
        uint64_t key;
        if (p >= end || !varint(&key)) return false;
        *number = (uint32_t)(key >> 3);
        *wire = (int)(key & 7);
        switch (*wire) {
        case 0: return varint(value);
        case 1: if (end - p < 8) return false; p += 8; return true;
        case 5: if (end - p < 4) return false; p += 4; return true;
        case 2:
            if (!varint(value) || *value > (uint64_t)(end - p)) return false;
            *sub = proto_reader{p, p + *value};
            p += *value;
            return true;
        default: return false;
        }
    }
};

struct model_facts {
    int model_type = 1;  // TrainerSpec.model_type (3): UNIGRAM 1, BPE 2
    bool suffix = false; // TrainerSpec.treat_whitespace_as_suffix (24)
    std::string normalizer = "";       // NormalizerSpec.name (1)
    bool charsmap = false;             // NormalizerSpec.precompiled_charsmap (2) non-empty
    bool dummy_prefix = true;          // (3)
    bool remove_extra_ws = true;       // (4)
    bool escape_ws = true;             // (5)
    bool rules = false;                // normalization_rule_tsv (6)
    bool byte_fallback = false;        // TrainerSpec.byte_fallback (35)
    bool user_or_unused = false;       // a piece of type USER_DEFINED (4) or UNUSED (5)
};

bool read_facts(const std::string &bytes, model_facts *f) {
    proto_reader r{(const unsigned char *)bytes.data(),
                   (const unsigned char *)bytes.data() + bytes.size()};
    uint32_t num;
    int wire;
    uint64_t v;
    proto_reader sub{nullptr, nullptr};
    while (r.p < r.end) {
        if (!r.field(&num, &wire, &v, &sub)) return false;
        if (wire != 2 || num < 1 || num > 3) continue;
        proto_reader s = sub, inner{nullptr, nullptr};
        uint32_t n2;
        int w2;
        uint64_t v2;
        while (s.p < s.end) {
            if (!s.field(&n2, &w2, &v2, &inner)) return false;
            if (num == 1 && w2 == 0 && n2 == 3 && (v2 == 4 || v2 == 5)) f->user_or_unused = true;
            if (num == 2 && w2 == 0 && n2 == 3) f->model_type = (int)v2;
            if (num == 2 && w2 == 0 && n2 == 35) f->byte_fallback = v2 != 0;
            if (num == 2 && w2 == 0 && n2 == 24) f->suffix = v2 != 0;
            if (num == 3 && w2 == 2 && n2 == 1) f->normalizer.assign((const char *)inner.p, v2);
            if (num == 3 && w2 == 2 && n2 == 2) f->charsmap = v2 > 0;
            if (num == 3 && w2 == 0 && n2 == 3) f->dummy_prefix = v2 != 0;
            if (num == 3 && w2 == 0 && n2 == 4) f->remove_extra_ws = v2 != 0;
            if (num == 3 && w2 == 0 && n2 == 5) f->escape_ws = v2 != 0;
            if (num == 3 && w2 == 2 && n2 == 6) f->rules = v2 > 0;
        }
    }
    return true;
}

// U+2581 (the escaped space) only at the start of a piece, as a run
bool spaces_lead_only(const std::string &piece) {
    static const char ws[] = "\xE2\x96\x81";
    size_t i = 0;
    while (piece.compare(i, 3, ws) == 0) i += 3;
    return piece.find(ws, i) == std::string::npos;
}

bool words_are_exact(sp_tokenizer *s, model_facts &f) {
    if (!read_facts(s->proc.serialized_model_proto(), &f)) return false;
    s->dummy_prefix = f.dummy_prefix;
    if (f.model_type != 2 || f.suffix || f.normalizer != "identity" || f.charsmap || f.rules ||
        f.remove_extra_ws || !f.escape_ws)
        return false;
    for (int id = 0; id < s->proc.GetPieceSize(); id++) {
        if (s->proc.IsControl(id) || s->proc.IsUnknown(id) || s->proc.IsByte(id)) continue;
        if (!spaces_lead_only(s->proc.IdToPiece(id))) return false;
    }
    return true;
}

// The library's message on one line: control characters as spaces, trailing blanks cut.
std::string one_line(const sentencepiece::util::Status &st) {
    std::string m = st.ToString();
    for (char &c : m)
        if ((unsigned char)c < 0x20) c = ' ';
    while (!m.empty() && m.back() == ' ') m.pop_back();
    return m;
}

// The C encoder over the model's pieces (normal ones mergeable), NULL when out of memory.
sp_bpe *native_encoder(sp_tokenizer *s, const model_facts &f) {
    int n = s->proc.GetPieceSize();
    sp_bpe *m = sp_bpe_create(n, s->proc.unk_id(), f.byte_fallback);
    for (int id = 0; m && id < n; id++) {
        const std::string &piece = s->proc.IdToPiece(id);
        bool special = s->proc.IsControl(id) || s->proc.IsUnknown(id) || s->proc.IsByte(id);
        if (sp_bpe_add_piece(m, id, piece.data(), piece.size(), s->proc.GetScore(id), !special)) {
            sp_bpe_free(m);
            m = nullptr;
        }
    }
    return m;
}

// ---- the table ----

int library_encode(sp_tokenizer *s, const char *text, size_t len, token_ids *out, char *err,
                   size_t errlen) {
    s->scratch.clear();
    auto st = s->proc.Encode(absl::string_view(text, len), &s->scratch);
    if (!st.ok()) {
        tokenizer_set_err(err, errlen, "%s: sentencepiece: %s", s->path.c_str(),
                          one_line(st).c_str());
        return -1;
    }
    static_assert(sizeof(int) == sizeof(int32_t), "library ids are int");
    if (token_ids_append(out, reinterpret_cast<const int32_t *>(s->scratch.data()),
                         s->scratch.size()) != 0) {
        tokenizer_set_err(err, errlen, "%s: out of memory", s->path.c_str());
        return -1;
    }
    return 0;
}

int encode_word(sp_tokenizer *s, const char *w, size_t len, token_ids *out, char *err,
                size_t errlen) {
    size_t n;
    const int32_t *ids = token_cache_get(s->cache, w, len, &n);
    if (!ids) {
        size_t before = out->n;
        if (s->native) {
            if (sp_bpe_encode(s->native, w, len, s->dummy_prefix, out) != 0) {
                tokenizer_set_err(err, errlen, "%s: out of memory", s->path.c_str());
                return -1;
            }
        } else if (library_encode(s, w, len, out, err, errlen) != 0) {
            return -1;
        }
        token_cache_put(s->cache, w, len, out->ids + before, out->n - before);
        return 0;
    }
    if (token_ids_append(out, ids, n) != 0) {
        tokenizer_set_err(err, errlen, "%s: out of memory", s->path.c_str());
        return -1;
    }
    return 0;
}

// The refusal of a piece longer than TOKENIZER_MAX_PIECE: a word, or the whole text.
int too_long(const sp_tokenizer *s, size_t n, char *err, size_t errlen) {
    tokenizer_set_err(err, errlen, "%s: %s of %zu bytes, more than the %d a tokenizer encodes "
                      "at once (its memory grows with the piece)", s->path.c_str(),
                      s->by_words ? "a word (a run of text up to a space)"
                                  : "a text (this model's texts are encoded whole)",
                      n, (int)TOKENIZER_MAX_PIECE);
    return -1;
}

int sp_encode(void *impl, const char *text, size_t len, token_ids *out, size_t *at, char *err,
              size_t errlen) {
    sp_tokenizer *s = static_cast<sp_tokenizer *>(impl);
    if (!s->by_words && len > TOKENIZER_MAX_PIECE) {
        *at = 0;
        return too_long(s, len, err, errlen);
    }
    if (!s->by_words || len == 0) return library_encode(s, text, len, out, err, errlen);
    // words end before a space that follows a non-space (U+2581 in the text counts as a
    // space: the normaliser leaves it as it is, the escaped space), except a lone space
    // ending the text: alone it would be a word the dummy prefix cannot stand for
    size_t start = 0;
    for (size_t i = 1; i <= len; i++) {
        if (i < len && !(text[i] == ' ' && text[i - 1] != ' ' && i + 1 < len &&
                         !(i >= 3 && memcmp(text + i - 3, "\xE2\x96\x81", 3) == 0)))
            continue;
        // a later word starts with a space, which the dummy prefix stands for
        size_t skip = start > 0 && s->dummy_prefix ? 1 : 0;
        if (i - start - skip > TOKENIZER_MAX_PIECE) {
            *at = start + skip;
            return too_long(s, i - start - skip, err, errlen);
        }
        if (encode_word(s, text + start + skip, i - start - skip, out, err, errlen) != 0)
            return -1;
        start = i;
    }
    return 0;
}

int sp_decode(void *impl, const int32_t *ids, size_t n, int skip_special, byte_buf *out,
              char *err, size_t errlen) {
    sp_tokenizer *s = static_cast<sp_tokenizer *>(impl);
    s->kept.clear();
    for (size_t i = 0; i < n; i++)
        if (!skip_special || !(s->proc.IsControl(ids[i]) || s->proc.IsUnknown(ids[i])))
            s->kept.push_back(ids[i]);
    // the library renders control pieces (<s>, </s>) as nothing: put their strings back
    // where they stand, unless they are skipped
    sentencepiece::ImmutableSentencePieceText spt;
    auto st = s->proc.Decode(s->kept, spt.mutable_proto());
    if (!st.ok()) {
        tokenizer_set_err(err, errlen, "%s: sentencepiece: %s", s->path.c_str(),
                          one_line(st).c_str());
        return -1;
    }
    const std::string &text = spt.text();
    size_t at = 0;
    int rc = 0;
    for (size_t i = 0; i < spt.pieces_size() && rc == 0; i++) {
        auto piece = spt.pieces((int)i);
        if (!s->proc.IsControl((int)piece.id())) continue;
        size_t begin = piece.begin() < text.size() ? piece.begin() : text.size();
        if (begin < at) begin = at;
        rc |= byte_buf_append(out, text.data() + at, begin - at);
        rc |= byte_buf_append(out, piece.piece().data(), piece.piece().size());
        at = begin;
    }
    rc |= byte_buf_append(out, text.data() + at, text.size() - at);
    if (rc != 0) {
        tokenizer_set_err(err, errlen, "%s: out of memory", s->path.c_str());
        return -1;
    }
    return 0;
}

int32_t sp_token_id(const void *impl, const char *str) {
    const sp_tokenizer *s = static_cast<const sp_tokenizer *>(impl);
    int id = s->proc.PieceToId(str);
    return id >= 0 && s->proc.IdToPiece(id) == str ? id : -1; // unknown strings map to unk
}

const char *sp_token_string(const void *impl, int32_t id) {
    return static_cast<const sp_tokenizer *>(impl)->proc.IdToPiece(id).c_str();
}

int sp_is_special(const void *impl, int32_t id) {
    const sp_tokenizer *s = static_cast<const sp_tokenizer *>(impl);
    return s->proc.IsControl(id) || s->proc.IsUnknown(id);
}

const char *sp_encoder(const void *impl) {
    const sp_tokenizer *s = static_cast<const sp_tokenizer *>(impl);
    return s->native     ? "words, BPE in C"
           : s->by_words ? "words, through libsentencepiece"
                         : "whole text, through libsentencepiece";
}

void sp_free(void *impl) {
    sp_tokenizer *s = static_cast<sp_tokenizer *>(impl);
    token_cache_free(s->cache);
    sp_bpe_free(s->native);
    delete s;
}

const tokenizer_ops sp_ops = {
    "sentencepiece", sp_encode,  sp_decode,  sp_token_id,
    sp_token_string, sp_is_special, sp_encoder, sp_free,
};

} // namespace

extern "C" int tokenizer_sp_open(tokenizer *t, const char *path, char *err, size_t errlen) {
    sp_tokenizer *s = new (std::nothrow) sp_tokenizer;
    if (!s || !(s->cache = token_cache_create(1 << 17))) {
        delete s;
        tokenizer_set_err(err, errlen, "%s: out of memory", path);
        return -1;
    }
    s->path = path;
    t->ops = &sp_ops;
    t->impl = s;
    auto st = s->proc.Load(path);
    if (!st.ok()) {
        tokenizer_set_err(err, errlen,
                          "%s: not a SentencePiece model (nor a tokenizer.json): sentencepiece "
                          "says: %s",
                          path, one_line(st).c_str());
        return -1;
    }
    model_facts facts;
    s->by_words = words_are_exact(s, facts);
    if (s->by_words && !facts.user_or_unused && !(s->native = native_encoder(s, facts))) {
        tokenizer_set_err(err, errlen, "%s: out of memory", path);
        return -1;
    }
    t->vocab_size = (uint32_t)s->proc.GetPieceSize();
    t->file.bos = s->proc.bos_id();
    t->file.eos = s->proc.eos_id();
    t->file.pad = s->proc.pad_id();
    t->file.add_bos = t->file.bos >= 0;
    t->file.add_eos = 0;
    return 0;
}
