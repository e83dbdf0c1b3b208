"""Reference side of tests/tokenizer_ref.sh: the ids and texts of PyPI's sentencepiece and
Hugging Face tokenizers, in the formats `shardlm data encode|decode` writes.

  tokenizer_ref.py encode-lines  sp|hf TOKENIZER < TEXT   ids of each line ('\\n' split)
  tokenizer_ref.py encode-whole  sp|hf TOKENIZER < TEXT   ids of the whole text, one line
  tokenizer_ref.py decode-lines  sp|hf TOKENIZER < IDS    text of each line of ids
  tokenizer_ref.py roundtrip     sp|hf TOKENIZER TEXT DECODED
        for every line of TEXT that the reference gives back unchanged (decode(encode(x))
        == x), the same line of DECODED (shardlm's) must be x too; prints the count
  tokenizer_ref.py make-variants DIR TRAIN_TEXT
        writes small byte-level BPE tokenizer.json files trained on TRAIN_TEXT, each with
        a structure a real model uses: DIR/llama3 (Split regex + ByteLevel without regex,
        ignore_merges, TemplateProcessing bos), DIR/gpt2x (ByteLevel with a prefix space,
        "a b" merge strings, added tokens with lstrip/rstrip/single_word/normalized),
        DIR/splits (Split behaviours Contiguous+invert, Removed, MergedWithNext,
        MergedWithPrevious), DIR/backtrack (a Split pattern, (a+)+$, that backtracks
        past the regex engine's limit on a long run of "a" not at the end)
  tokenizer_ref.py make-sp-variants DIR TRAIN_TEXT
        writes small SentencePiece models trained on TRAIN_TEXT, one for each way shardlm
        encodes: DIR/sp-user.model (BPE, identity normaliser, byte fallback, user-defined
        symbols: words through the library), DIR/sp-nfkc.model (the default nmt_nfkc
        normaliser, extra whitespace removed: the whole text through the library),
        DIR/sp-nofallback.model (BPE, identity, no byte fallback: words in C, unknown
        characters as unk)

Text is read as bytes and split on b'\\n' only (a last line without '\\n' counts);
sentencepiece gets bytes (it takes invalid UTF-8), tokenizers gets str.
"""
import json
import os
import sys


def lines_of(data):
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return lines


class Ref:
    def __init__(self, kind, path):
        self.kind = kind
        if kind == "sp":
            import sentencepiece

            self.t = sentencepiece.SentencePieceProcessor(model_file=path)
        else:
            from tokenizers import Tokenizer

            if os.path.isdir(path):
                path = os.path.join(path, "tokenizer.json")
            self.t = Tokenizer.from_file(path)

    def encode(self, b):
        if self.kind == "sp":
            return self.t.encode(b)
        return self.t.encode(b.decode("utf-8"), add_special_tokens=False).ids

    def decode(self, ids):
        if self.kind == "sp":
            return self.t.decode(ids).encode("utf-8")
        return self.t.decode(ids, skip_special_tokens=False).encode("utf-8")


def out(s):
    sys.stdout.buffer.write(s)


def make_variants(root, train):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import processors, trainers

    llama3_pattern = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
        r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    pt = pre_tokenizers
    variants = {
        "llama3": pt.Sequence(
            [
                pt.Split(Regex(llama3_pattern), behavior="isolated", invert=False),
                pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
            ]
        ),
        "gpt2x": pt.Sequence(
            [
                pt.Split("-", behavior="merged_with_previous"),
                pt.Digits(individual_digits=False),
                pt.ByteLevel(add_prefix_space=True, use_regex=True),
            ]
        ),
        "splits": pt.Sequence(
            [
                pt.Split(Regex(r"[0-9]+"), behavior="contiguous", invert=True),
                pt.Split(Regex(r","), behavior="removed"),
                pt.Split(Regex(r"\s"), behavior="merged_with_next"),
                pt.Split(Regex(r"[.;:!?]"), behavior="merged_with_previous"),
                pt.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        ),
        "backtrack": pt.Sequence(
            [
                pt.Split(Regex(r"(a+)+$"), behavior="isolated", invert=False),
                pt.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        ),
    }
    for name, pre in variants.items():
        tok = Tokenizer(models.BPE(ignore_merges=(name == "llama3")))
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "</s>"]
        trainer = trainers.BpeTrainer(
            vocab_size=1200,
            special_tokens=specials,
            initial_alphabet=pt.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train([train], trainer)
        if name == "llama3":
            tok.post_processor = processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))],
            )
        if name == "gpt2x":
            tok.add_special_tokens([AddedToken("<|user|>", lstrip=True, rstrip=True)])
            tok.add_tokens(
                [
                    AddedToken("[MASK]", single_word=True),
                    AddedToken("XYZ", normalized=True),
                    AddedToken("thou art", normalized=False),
                ]
            )
        os.makedirs(os.path.join(root, name), exist_ok=True)
        path = os.path.join(root, name, "tokenizer.json")
        tok.save(path)
        j = json.load(open(path, encoding="utf-8"))
        if name == "gpt2x":  # the older merges format: "a b" strings
            j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
        if name == "llama3":
            # whole words the merges do not make: ignore_merges makes each one token
            counts = {}
            for line in open(train, encoding="utf-8").read().split("\n")[:3000]:
                for w, _ in tok.pre_tokenizer.pre_tokenize_str(line):
                    counts[w] = counts.get(w, 0) + 1
            vocab = j["model"]["vocab"]
            top = sorted(counts, key=lambda w: -counts[w])
            words = [w for w in top if w not in vocab and len(tok.encode(w).ids) > 2][:60]
            for w in words:
                vocab[w] = max(vocab.values()) + 1
        json.dump(j, open(path, "w", encoding="utf-8"), ensure_ascii=False)
        Tokenizer.from_file(path)  # the reference still loads it


def make_sp_variants(root, train):
    import sentencepiece

    common = dict(input=train, vocab_size=800, model_type="bpe", unk_id=0, bos_id=1, eos_id=2,
                  pad_id=-1, minloglevel=2)
    identity = dict(normalization_rule_name="identity", remove_extra_whitespaces=False)
    os.makedirs(root, exist_ok=True)
    train_one = sentencepiece.SentencePieceTrainer.train
    train_one(model_prefix=os.path.join(root, "sp-user"), byte_fallback=True,
              user_defined_symbols=["<|im_start|>", "<|im_end|>"], **identity, **common)
    train_one(model_prefix=os.path.join(root, "sp-nfkc"), byte_fallback=True, **common)
    train_one(model_prefix=os.path.join(root, "sp-nofallback"), byte_fallback=False,
              **identity, **common)


def main():
    cmd = sys.argv[1]
    if cmd == "make-variants":
        make_variants(sys.argv[2], sys.argv[3])
        return 0
    if cmd == "make-sp-variants":
        make_sp_variants(sys.argv[2], sys.argv[3])
        return 0
    ref = Ref(sys.argv[2], sys.argv[3])
    if cmd == "encode-lines":
        for line in lines_of(sys.stdin.buffer.read()):
            out((" ".join(map(str, ref.encode(line))) + "\n").encode())
    elif cmd == "encode-whole":
        out((" ".join(map(str, ref.encode(sys.stdin.buffer.read()))) + "\n").encode())
    elif cmd == "decode-lines":
        for line in lines_of(sys.stdin.buffer.read()):
            out(ref.decode([int(x) for x in line.split()]) + b"\n")
    elif cmd == "roundtrip":
        text = lines_of(open(sys.argv[4], "rb").read())
        ours = lines_of(open(sys.argv[5], "rb").read())
        if len(ours) != len(text):
            print(f"roundtrip: {len(ours)} decoded lines for {len(text)} input lines")
            return 1
        n, bad = 0, []
        for i, (x, y) in enumerate(zip(text, ours)):
            if ref.decode(ref.encode(x)) == x:
                n += 1
                if y != x:
                    bad.append(i + 1)
        print(f"roundtrip: {n} of {len(text)} lines round-trip in the reference", end="")
        if bad:
            print(f"; shardlm differs on {len(bad)}, first line {bad[0]}")
            return 1
        print("; shardlm gives all of them back")
    else:
        print(f"unknown command {cmd}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
