#!/bin/sh
# Tokenizer files and commands without the reference libraries: a hand-made tokenizer.json
# encodes and decodes as worked out by hand; bad files (missing, corrupt or truncated
# tokenizer.json, a corrupt tokenizer.model, an unsupported model, pre-tokenizer or
# normalizer, a bad tokenizer_config.json) and bad input give one clear line; special tokens
# follow the precedence of src/tokenizer/tokenizer_specials.c; `data prepare` writes bos, eos, the
# tokenizer's vocabulary and the width it needs.
# Reproduce: make check TESTS=tests/tokenizer_errors.sh
. "$SHLM_SRCDIR/tests/lib.sh"
test_begin tokenizer_errors tokerr

# expect_error WHAT PATTERN... -- CMD...: CMD fails with one line naming every PATTERN
expect_error() {
    what=$1
    shift
    run_expecting_error "$@"
    if [ $rc -eq 0 ]; then
        fail "$what: succeeded"
        return
    fi
    [ -z "$why" ] || fail "$what: $why: $(head -c 300 "$work/err")"
}

# expect_out WHAT EXPECTED INPUT CMD...: CMD with INPUT on stdin prints EXPECTED
expect_out() {
    what=$1 want=$2 input=$3
    shift 3
    echo "+ printf '%s' '$input' | $*"
    got=$(printf '%s' "$input" | "$@" 2>"$work/err") || { fail "$what: $(cat "$work/err")"; return; }
    [ "$got" = "$want" ] || fail "$what: got '$got', expected '$want'"
}

# a byte-level BPE over a b Ġ (space) with merges (a b), (Ġ ab); <s> and </s> added
tiny=$work/tiny
mkdir -p "$tiny"
cat >"$tiny/tokenizer.json" <<'EOF'
{
  "version": "1.0",
  "added_tokens": [
    {"id": 5, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
     "normalized": false, "special": true},
    {"id": 6, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
     "normalized": false, "special": true}
  ],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [5], "tokens": ["<s>"]}}},
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": {"a": 0, "b": 1, "\u0120": 2, "ab": 3, "\u0120ab": 4, "<s>": 5, "</s>": 6},
            "merges": ["a b", "\u0120 ab"]}
}
EOF
T=$tiny/tokenizer.json
expect_out "encode" "3 4 2 0" "ab ab a" "$SHLM" data encode --tokenizer "$T"
expect_out "encode: added tokens inside text" "3 5 1 6 0" "ab<s>b</s>a" "$SHLM" data encode --tokenizer "$tiny"
expect_out "encode --add-special: bos from the post-processor" "5 3" "ab" "$SHLM" data encode --tokenizer "$T" --add-special
expect_out "encode --bos --eos (no eos: error)" "" "ab" sh -c "! '$SHLM' data encode --tokenizer '$T' --eos 2>/dev/null"
expect_out "encode --lines" "3|4||" "ab
 ab

" sh -c "'$SHLM' data encode --tokenizer '$T' --lines | tr '\n' '|'"
expect_out "decode" "<s>ab ab</s>" "5 3 4 6" "$SHLM" data decode --tokenizer "$T"
expect_out "decode --skip-special" "ab ab" "5,3,4,6" "$SHLM" data decode --tokenizer "$T" --skip-special
expect_out "decode --stream" "<s>ab ab</s>" "5 3 4 6" "$SHLM" data decode --tokenizer "$T" --stream
expect_out "bytes" "104 105" "hi" "$SHLM" data encode --tokenizer bytes
expect_out "bytes decode" "hi" "104 105" "$SHLM" data decode --tokenizer bytes

# bad input to the commands
expect_error "decode: not an id" "stdin:2: 'x3' is not a token id (byte 3 of the line, counting from 1)" -- \
    sh -c "printf '3\n3 x3' | '$SHLM' data decode --tokenizer '$T'"
expect_error "decode: id out of range" "99" "outside the vocabulary" -- sh -c "echo '3 99' | '$SHLM' data decode --tokenizer '$T'"
expect_error "encode: no --tokenizer" "needs --tokenizer" -- "$SHLM" data encode
expect_error "encode: unknown flag" "--frob" -- "$SHLM" data encode --tokenizer bytes --frob
expect_error "encode: invalid UTF-8" "stdin:1: " "invalid UTF-8" "(byte 3 of the line, counting from 1)" -- \
    sh -c "printf 'ab\377' | '$SHLM' data encode --tokenizer '$T'"
expect_error "encode: invalid UTF-8 on line 2" "stdin:2: " "invalid UTF-8" "(byte 4 of the line, counting from 1)" -- \
    sh -c "printf 'ab\nab \377' | '$SHLM' data encode --tokenizer '$T'"
expect_error "encode --lines: invalid UTF-8 on line 3" "stdin:3: " "(byte 2 of the line, counting from 1)" -- \
    sh -c "printf 'ab\n\na\377' | '$SHLM' data encode --tokenizer '$T' --lines"
# a pre-token longer than TOKENIZER_MAX_PIECE (4 MiB) is refused, one at the limit taken
head -c 4194304 /dev/zero | tr '\0' a >"$work/long"
expect_out "a pre-token of 4 MiB" "4194304" "" sh -c "'$SHLM' data encode --tokenizer '$T' <'$work/long' | wc -w"
printf 'a' >>"$work/long"
expect_error "a pre-token past 4 MiB" "stdin:1: " "a pre-token (a piece encoded whole) of 4194305 bytes" \
    "more than the 4194304" "(byte 1 of the line, counting from 1)" -- \
    sh -c "'$SHLM' data encode --tokenizer '$T' <'$work/long'"

# bad tokenizer files
expect_error "missing file" "$work/nope.json" "no such tokenizer" -- "$SHLM" data encode --tokenizer "$work/nope.json"
mkdir -p "$work/empty"
expect_error "directory without a tokenizer" "$work/empty" "no tokenizer.model or tokenizer.json" -- \
    "$SHLM" data encode --tokenizer "$work/empty"
head -c 700 "$T" >"$work/truncated.json"
expect_error "truncated tokenizer.json" "$work/truncated.json" "corrupt or truncated" -- \
    "$SHLM" data encode --tokenizer "$work/truncated.json"
# variant FILE SED: the tiny tokenizer.json edited by SED into FILE
variant() { sed "$2" "$T" >"$work/$1"; }
variant wordpiece.json 's/"type": "BPE"/"type": "WordPiece"/'
expect_error "WordPiece model" "wordpiece.json" "WordPiece" "not supported" -- "$SHLM" data encode --tokenizer "$work/wordpiece.json"
variant unigram.json 's/"type": "BPE"/"type": "Unigram"/'
expect_error "Unigram model" "unigram.json" "Unigram" -- "$SHLM" data encode --tokenizer "$work/unigram.json"
variant metaspace.json 's/"pre_tokenizer": {"type": "ByteLevel"/"pre_tokenizer": {"type": "Metaspace"/'
expect_error "Metaspace pre-tokenizer" "metaspace.json" "Metaspace" "not supported" -- "$SHLM" data encode --tokenizer "$work/metaspace.json"
variant nfkc.json 's/"normalizer": null/"normalizer": {"type": "NFKC"}/'
expect_error "NFKC normalizer" "nfkc.json" "NFKC" -- "$SHLM" data encode --tokenizer "$work/nfkc.json"
variant merge.json 's/"a b", /"a c", /'
expect_error "merge of an unknown token" "merge.json" "merge 0" "not in the vocabulary" -- "$SHLM" data encode --tokenizer "$work/merge.json"
variant badre.json 's/"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},/"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(("}, "behavior": "Isolated"}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]},/'
expect_error "regex that does not compile" "badre.json" "PCRE2" -- "$SHLM" data encode --tokenizer "$work/badre.json"
# an error of PCRE2 while splitting (its match limit) is an error, not the end of the
# matches: tokenizers stops there too ("Onig: Regex search error: retry-limit-in-match
# over" for this pattern and text)
variant backtrack.json 's/"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},/"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated"}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]},/'
expect_error "PCRE2's match limit" "stdin:1: " "backtrack.json" "pattern cannot split" "match limit" -- \
    sh -c "printf 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!' | '$SHLM' data encode --tokenizer '$work/backtrack.json'"
expect_out "the same pattern where it ends" "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0" "aaaaaaaaaaaaaaaaaaaa!" \
    sh -c "'$SHLM' data encode --tokenizer '$work/backtrack.json' 2>&1 | cut -d' ' -f1-20"
# what a JSON file holds that the reader refuses, named with its line and byte
variant surrogate.json 's/"vocab": {"a": 0,/"vocab": {"a\\ud800": 9, "a": 0,/'
ln=$(grep -n 'ud800' "$work/surrogate.json" | cut -d: -f1)
expect_error "a lone surrogate in tokenizer.json" "surrogate.json:$ln: a lone surrogate \\ud800" \
    "(byte 25 of the line, counting from 1)" -- "$SHLM" data encode --tokenizer "$work/surrogate.json"
deep=$(awk 'BEGIN { for (i = 0; i < 1001; i++) printf "["; for (i = 0; i < 1001; i++) printf "]" }')
variant deep.json "s/\"version\": \"1.0\",/\"version\": \"1.0\", \"x\": $deep,/"
expect_error "tokenizer.json nested too deep" "deep.json:2: arrays and objects nested deeper than 1000 levels" \
    "(byte 1025 of the line, counting from 1)" -- "$SHLM" data encode --tokenizer "$work/deep.json"
variant bigid.json 's/{"id": 6, "content": "<\/s>"/{"id": 16777216, "content": "<\/s>"/'
expect_error "an added token's id out of range" "bigid.json" 'added_tokens entry 1 ("</s>"): id 16777216, outside [0, 16777215]' -- \
    "$SHLM" data encode --tokenizer "$work/bigid.json"
variant negid.json 's/"\\u0120ab": 4,/"\\u0120ab": -4,/'
expect_error "a vocabulary id out of range" "negid.json" 'vocab entry "' 'id -4, outside [0, 16777215]' -- \
    "$SHLM" data encode --tokenizer "$work/negid.json"
printf 'not a protobuf at all, just some text\n' >"$work/tokenizer.model"
expect_error "corrupt tokenizer.model" "$work/tokenizer.model" "not a SentencePiece model" -- \
    "$SHLM" data encode --tokenizer "$work/tokenizer.model"
. "$SHLM_SRCDIR/tests/pyenv.sh"
if sp=$(shlm_wheel_file mistral-common mistral_common/data/tokenizer.model.v1); then
    head -c 100000 "$sp" >"$work/cut.model"
    expect_error "truncated tokenizer.model" "$work/cut.model" "not a SentencePiece model" -- \
        "$SHLM" data encode --tokenizer "$work/cut.model"
    # a SentencePiece word (a run up to a space) past 4 MiB, on line 2 of a text file
    { printf 'short line\nx '; cat "$work/long"; } >"$work/long.txt"
    expect_error "a SentencePiece word past 4 MiB" "long.txt:2: " "a word (a run of text up to a space) of 4194305 bytes" \
        "(byte 3 of the line, counting from 1)" -- \
        "$SHLM" data prepare --tokenizer "$sp" "$work/long.txt" "$work/long.bin"
else
    skip_part "the SentencePiece cases: $sp"
fi

# special tokens: tokenizer_config.json over the file, generation_config.json's eos list
cp "$T" "$work/empty/tokenizer.json"
dir=$work/empty
echo '{"bos_token": {"content": "</s>"}, "eos_token": "</s>", "add_bos_token": false,
 "chat_template": "{{ messages }}"}' >"$dir/tokenizer_config.json"
echo '{"eos_token_id": [6, 0, 6]}' >"$dir/generation_config.json"
echo '{"eos_token_id": 1, "pad_token_id": 3}' >"$dir/config.json"
"$SHLM" data tokenizer --tokenizer "$dir" >"$work/info" 2>&1 || fail "data tokenizer: $(cat "$work/info")"
for want in "bos          6 </s>" "eos          6 </s>" "pad          3 ab" "eos_ids      6 0" \
    "add_bos      false" "chat_template 14 bytes"; do
    grep -q -F -x "$want" "$work/info" || fail "precedence: no line '$want' in: $(tr '\n' '|' <"$work/info")"
done
echo '{"bos_token": "<s>"}' >"$dir/special_tokens_map.json"
echo '{"eos_token_id": 1}' >"$dir/generation_config.json"
printf '{%% for m in messages %%}{{ m }}{%% endfor %%}' >"$dir/chat_template.jinja"
"$SHLM" data tokenizer --tokenizer "$dir" >"$work/info" 2>&1 || fail "data tokenizer: $(cat "$work/info")"
for want in "bos          5 <s>" "eos_ids      6 1" "chat_template 42 bytes"; do
    grep -q -F -x "$want" "$work/info" || fail "precedence 2: no line '$want' in: $(tr '\n' '|' <"$work/info")"
done
echo '{"bos_token": "<unknown>"}' >"$dir/special_tokens_map.json"
expect_error "bos_token not in the vocabulary" "special_tokens_map.json" "<unknown>" -- \
    "$SHLM" data encode --tokenizer "$dir"
rm "$dir/special_tokens_map.json"
echo '{"eos_token_id": [6, ' >"$dir/generation_config.json"
expect_error "corrupt generation_config.json" "generation_config.json" "corrupt or truncated" -- \
    "$SHLM" data encode --tokenizer "$dir"
echo '{"eos_token_id": 7}' >"$dir/generation_config.json"
expect_error "eos id out of range" "generation_config.json" "eos_token_id" "7" -- \
    "$SHLM" data encode --tokenizer "$dir"
echo '{"eos_token_id": 6}' >"$dir/generation_config.json"
echo '{"added_tokens_decoder": {"7": {"content": "<|im_start|>", "special": true}}}' \
    >"$dir/tokenizer_config.json"
expect_error "added token not in tokenizer.json" "tokenizer_config.json" "<|im_start|>" -- \
    "$SHLM" data encode --tokenizer "$dir"
echo '{"add_eos_token": true, "eos_token": null}' >"$dir/tokenizer_config.json"
echo '{}' >"$dir/generation_config.json"
rm "$dir/config.json"
variant noeos.json 's/"post_processor": {"type": "TemplateProcessing",/"post_processor": {"type": "ByteLevel", "x": {/; s/"pair": \[\], "special_tokens"/"special_tokens"/; s/\["<s>"\]}}},/["<s>"]}}}},/'
cp "$work/noeos.json" "$dir/tokenizer.json"
expect_error "add_eos_token without an eos" "add_eos_token" "no eos" -- "$SHLM" data encode --tokenizer "$dir"

# data prepare: bos (post-processor) + ids + eos (tokenizer_config.json), vocab and width
echo '{"eos_token": "</s>"}' >"$dir/tokenizer_config.json"
cp "$T" "$dir/tokenizer.json"
printf 'ab ab' >"$work/doc.txt"
"$SHLM" data prepare --tokenizer "$dir" "$work/doc.txt" "$work/doc.bin" >"$work/prep" 2>&1 ||
    fail "data prepare: $(cat "$work/prep")"
got=$(od -A n -t u4 -j 12 -N 16 "$work/doc.bin" | tr -s ' ')
[ "$got" = " 2 4 0 7" ] || fail "data prepare header (width, count, count-high, vocab): got '$got'"
got=$(od -A n -t u2 -j 96 -N 8 "$work/doc.bin" | tr -s ' ') # version 2: ids after 96 bytes
[ "$got" = " 5 3 4 6" ] || fail "data prepare ids: got '$got', expected bos 5, 3 4, eos 6"
# a vocabulary past 65,536 ids needs width 4
sed 's/"id": 6, "content": "<\/s>"/"id": 70000, "content": "<\/s>"/' "$T" >"$dir/tokenizer.json"
"$SHLM" data prepare --tokenizer "$dir" "$work/doc.txt" "$work/doc4.bin" >"$work/prep" 2>&1 ||
    fail "data prepare (vocab 70001): $(cat "$work/prep")"
got=$(od -A n -t u4 -j 12 -N 16 "$work/doc4.bin" | tr -s ' ')
[ "$got" = " 4 4 0 70001" ] || fail "data prepare (vocab 70001) header: got '$got'"
expect_error "--width 2 for a vocab of 70001" "--width 2" "70001" -- \
    "$SHLM" data prepare --tokenizer "$dir" --width 2 "$work/doc.txt" "$work/doc4.bin"

echo "$test_name: $fails failures"
test_end
