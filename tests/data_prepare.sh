#!/bin/sh
# `shardlm data prepare|info|render` without the reference libraries: every format on the
# byte tokenizer and on byte-level test tokenizers with ChatML and Llama-2 templates
# (tests/sft_data.py writes them), the token file checked against what the format's
# definition says (tests/sft_data.py prompt-response, reading the file from io/tokens.h's
# layout alone), documents over --max-doc-len truncated or dropped and reported, and every
# kind of bad input refused with one line naming FILE:LINE. Needs python3 (skipped
# without).
# Reproduce: make check TESTS=tests/data_prepare.sh
#   or: SHLM=./shardlm SHLM_SRCDIR=. sh tests/data_prepare.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
. "$SHLM_SRCDIR/tests/lib.sh"
command -v python3 >/dev/null 2>&1 || skip_test "no python3"
test_begin data_prepare shlm-data-prepare
py="python3 $SHLM_SRCDIR/tests/sft_data.py"
data="$SHLM_SRCDIR/examples/smollm2/data"
$py tokenizers "$work/tk" || fail "tests/sft_data.py tokenizers failed"
chatml=$work/tk/chatml llama2=$work/tk/llama2 other=$work/tk/other

# ok WHAT CMD...: CMD succeeds (stdout in $work/out, stderr in $work/err)
ok() {
    what=$1
    shift
    echo "+ $*"
    "$@" >"$work/out" 2>"$work/err" </dev/null || fail "$what: exit $?: $(head -c 400 "$work/err")"
}
# info FILE KEY: the value of KEY in `data info FILE`
info() { "$SHLM" data info "$1" | awk -v k="$2" '$1 == k { print $2 }'; }
# refused WHAT STATUS PATTERN... -- CMD...: CMD exits STATUS with one error line naming
# every PATTERN, and leaves no output file $work/refused.bin
refused() {
    what=$1 want=$2
    shift 2
    run_expecting_error "$@"
    if [ $rc -ne "$want" ] || [ -n "$why" ]; then
        fail "$what: exit $rc (want $want) $why: $(head -c 300 "$work/err")"
    elif [ -e "$work/refused.bin" ]; then
        fail "$what: an output file was left behind"
    else
        echo "data_prepare: ok: $what: $(cat "$work/err")"
    fi
}

# ---- formats ----
# prompt-response on bytes: ids and mask exactly as the format's definition says
ok "prompt-response (bytes)" "$SHLM" data prepare --tokenizer bytes --format prompt-response \
    "$data/prompt-response-train.jsonl" "$work/pr.bin"
$py prompt-response "$data/prompt-response-train.jsonl" "$work/pr.bin" ||
    fail "prompt-response on bytes: the token file is not what the format says"
# Alpaca records, with and without input, and the prompt-response keys mixed in one file
cat >"$work/alpaca.jsonl" <<'EOF'
{"instruction": "Name a colour.", "input": "", "output": "Blue."}
{"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"}

{"prompt": "Q: 1+1?\nA: ", "response": "2", "id": 7}
EOF
ok "alpaca (bytes)" "$SHLM" data prepare --tokenizer bytes --format prompt-response \
    "$work/alpaca.jsonl" "$work/alpaca.bin"
$py prompt-response "$work/alpaca.jsonl" "$work/alpaca.bin" ||
    fail "Alpaca records: the token file is not what the format says"
# truncate and drop, counted and reported (never silent), not an error
ok "--max-doc-len 100 truncate" "$SHLM" data prepare --tokenizer bytes --format prompt-response \
    --max-doc-len 100 "$data/prompt-response-train.jsonl" "$work/trunc.bin"
$py prompt-response "$data/prompt-response-train.jsonl" "$work/trunc.bin" 100 ||
    fail "--max-doc-len 100: the documents are not cut to 100 tokens"
n_trunc=$(info "$work/trunc.bin" truncated)
grep -q "shardlm: warning: data: .*prompt-response-train.jsonl: $n_trunc of 770 documents were longer than --max-doc-len 100 tokens and were truncated to it (the first at line [0-9]*; the longest, [0-9]* tokens, at line [0-9]*)" \
    "$work/err" && [ "$n_trunc" -gt 0 ] && [ "$(info "$work/trunc.bin" longest)" -eq 100 ] ||
    fail "truncation not reported ($n_trunc truncated): $(cat "$work/err")"
ok "--max-doc-len 100 --overlong drop" "$SHLM" data prepare --tokenizer bytes \
    --format prompt-response --max-doc-len 100 --overlong drop "$data/prompt-response-train.jsonl" \
    "$work/drop.bin"
[ "$(info "$work/drop.bin" dropped)" = "$n_trunc" ] &&
    [ "$(info "$work/drop.bin" documents)" -eq $((770 - n_trunc)) ] &&
    grep -q "and were dropped" "$work/err" ||
    fail "drop: $(info "$work/drop.bin" dropped) dropped, $(cat "$work/err")"
# jsonl-text: each record a document, everything trained
printf '{"text": "one"}\n{"text": "two words"}\n' >"$work/texts.jsonl"
ok "jsonl-text" "$SHLM" data prepare --tokenizer bytes --format jsonl-text "$work/texts.jsonl" \
    "$work/texts.bin"
[ "$(info "$work/texts.bin" documents)" = 2 ] && [ "$(info "$work/texts.bin" tokens)" = 12 ] &&
    [ "$(info "$work/texts.bin" trained)" = 12 ] && [ "$(info "$work/texts.bin" format)" = jsonl-text ] ||
    fail "jsonl-text: $("$SHLM" data info "$work/texts.bin" | tr '\n' ' ')"
# chat with both templates: the rendering and what it trains, by hand
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}, {"role": "assistant", "content": " ok "}]}' \
    >"$work/chat.jsonl"
ok "render chatml" "$SHLM" data render --tokenizer "$chatml" --format chat "$work/chat.jsonl"
want='{"line":1,"text":"<|im_start|>system\nYou are a test assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n ok <|im_end|>\n","trained":[[107,119],[174,188]]}'
[ "$(cat "$work/out")" = "$want" ] || fail "chatml render: $(cat "$work/out")"
ok "render llama2" "$SHLM" data render --tokenizer "$llama2" --format chat "$work/chat.jsonl"
want='{"line":1,"text":"<s>[INST] hi [/INST] yo </s><s>[INST] more [/INST] ok </s>","trained":[[20,28],[50,58]]}'
[ "$(cat "$work/out")" = "$want" ] || fail "llama2 render: $(cat "$work/out")"
ok "render chatml by name (no default system prompt)" "$SHLM" data render --tokenizer "$chatml" \
    --format chat --chat-template chatml "$work/chat.jsonl"
case $(cat "$work/out") in '{"line":1,"text":"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>'*) ;;
*) fail "chatml by name: $(cat "$work/out")" ;; esac
ok "prepare chat (chatml)" "$SHLM" data prepare --tokenizer "$chatml" --format chat \
    "$work/chat.jsonl" "$work/chat.bin"
# the ids are the bytes with 256/257 for <|im_start|>/<|im_end|>; trained: yo<|im_end|>, " ok "<|im_end|>
python3 - "$SHLM_SRCDIR/tests/sft_data.py" "$work/chat.bin" <<'EOF' || fail "chatml token file"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("sft_data", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
h, ids, trained, doc = m.read(sys.argv[2])
text = "".join("\x01" if i == 256 else "\x02" if i == 257 else chr(i) for i in ids)
want = "\x01system\nYou are a test assistant.\x02\n\x01user\nhi\x02\n\x01assistant\nyo\x02\n\x01user\nmore\x02\n\x01assistant\n ok \x02\n"
got = "".join(c for c, t in zip(text, trained) if t)
assert text == want, repr(text)
assert got == "yo\x02 ok \x02", repr(got)
assert doc == [1] + [0] * (len(ids) - 1) and h["chat_template"] == 1 and h["format"] == 4, h
EOF
ok "prepare chat (llama2)" "$SHLM" data prepare --tokenizer "$llama2" --format chat \
    "$work/chat.jsonl" "$work/chat2.bin"
[ "$(info "$work/chat2.bin" trained)" = 10 ] && [ "$(info "$work/chat2.bin" chat_template)" = llama2 ] ||
    fail "llama2 chat: $("$SHLM" data info "$work/chat2.bin" | tr '\n' ' ')"
# prompt-response with the model's template: a two-turn chat
printf '{"prompt": "hi", "response": "yo"}\n' >"$work/pair.jsonl"
ok "prompt-response with the template" "$SHLM" data render --tokenizer "$chatml" \
    --format prompt-response "$work/pair.jsonl"
case $(cat "$work/out") in *'<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n","trained":[[107,119]]}') ;;
*) fail "prompt-response with chatml: $(cat "$work/out")" ;; esac
ok "prompt-response --chat-template none" "$SHLM" data render --tokenizer "$chatml" \
    --format prompt-response --chat-template none "$work/pair.jsonl"
[ "$(cat "$work/out")" = '{"line":1,"text":"hiyo<|im_end|>","trained":[[2,14]]}' ] ||
    fail "prompt-response without a template: $(cat "$work/out")"

# ---- bad input: one line naming the file and line, nothing written ----
bad=$work/bad.jsonl
out=$work/refused.bin
expect_bad() { # WHAT FORMAT TOKENIZER LINE-CONTENT PATTERN...: line 1 good, line 2 bad
    what=$1 fmt=$2 tok=$3
    case $fmt in
    prompt-response) good='{"prompt": "a", "response": "b"}' ;;
    jsonl-text) good='{"text": "a"}' ;;
    *) good='{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}' ;;
    esac
    printf '%s\n%s\n' "$good" "$4" >"$bad"
    shift 4
    refused "$what" 1 "$bad:2: " "$@" -- "$SHLM" data prepare --tokenizer "$tok" --format "$fmt" "$bad" "$out"
}
expect_bad "missing field" prompt-response bytes '{"prompt": "a"}' 'missing "response"'
expect_bad "missing field (alpaca)" prompt-response bytes '{"instruction": "a", "input": "x"}' 'missing "output"'
expect_bad "both kinds of keys" prompt-response bytes '{"prompt": "a", "response": "b", "output": "c"}' "not both"
expect_bad "wrong type" prompt-response bytes '{"prompt": 5, "response": "b"}' '"prompt" must be a string, not a number'
expect_bad "empty response" prompt-response bytes '{"prompt": "a", "response": " \t"}' 'empty "response": nothing to train on'
expect_bad "empty output" prompt-response bytes '{"instruction": "a", "output": ""}' 'empty "output"'
expect_bad "not JSON" prompt-response bytes '{"prompt": "a", "response": "b"' "not a JSON value"
expect_bad "text after the object" prompt-response bytes '{"prompt": "a", "response": "b"} x' \
    "text follows the JSON value (byte 34 of the line, counting from 1)"
expect_bad "not an object" prompt-response bytes '["a", "b"]' "a record must be a JSON object, not an array"
expect_bad "NUL" prompt-response bytes '{"prompt": "a\u0000", "response": "b"}' \
    'the escape \u0000 (U+0000)' "(byte 14 of the line, counting from 1)"
# what cJSON would take wrongly or refuse for another reason than it says
expect_bad "a key twice" jsonl-text bytes '{"text": "a", "text": "b"}' 'the key "text" appears twice in one object'
expect_bad "a key twice, nested" chat "$chatml" \
    '{"messages": [{"role": "user", "content": "a", "content": "c"}, {"role": "assistant", "content": "b"}]}' \
    'the key "content" appears twice in one object'
expect_bad "a lone surrogate" jsonl-text bytes '{"text": "a\ud800b"}' 'a lone surrogate \ud800' \
    "(byte 12 of the line, counting from 1)"
expect_bad "a lone low surrogate" jsonl-text bytes '{"text": "a\udc00\ud800b"}' 'a lone surrogate \udc00'
expect_bad "nested too deep" jsonl-text bytes \
    "{\"text\": \"a\", \"x\": $(awk 'BEGIN { for (i = 0; i < 1000; i++) printf "["; for (i = 0; i < 1000; i++) printf "]" }')}" \
    "nested deeper than 1000 levels" "(byte 1019 of the line, counting from 1)"
printf '{"text": "a"}\n{"text": "a\000b"}\n' >"$bad"
refused "a raw NUL byte" 1 "$bad:2: a NUL byte (U+0000)" "(byte 12 of the line, counting from 1)" -- \
    "$SHLM" data prepare --tokenizer bytes --format jsonl-text "$bad" "$out"
expect_bad "missing text" jsonl-text bytes '{"txt": "a"}' 'missing "text"'
expect_bad "empty text" jsonl-text bytes '{"text": ""}' 'empty "text"'
expect_bad "missing messages" chat "$chatml" '{"msgs": []}' 'missing "messages"'
expect_bad "messages not a list" chat "$chatml" '{"messages": {"role": "user"}}' '"messages" must be a non-empty array, not an object'
expect_bad "message without content" chat "$chatml" '{"messages": [{"role": "user"}]}' 'message 1: missing "content"'
expect_bad "content not a string" chat "$chatml" '{"messages": [{"role": "user", "content": ["a"]}]}' 'message 1: "content" must be a string, not an array'
expect_bad "unknown role" chat "$chatml" '{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}' "message 1: unknown role 'tool' (system, user or assistant)"
expect_bad "empty assistant message" chat "$chatml" '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "  "}]}' "message 2: empty assistant message"
expect_bad "no assistant message" chat "$chatml" '{"messages": [{"role": "user", "content": "x"}]}' "no assistant message"
expect_bad "llama2: roles not alternating" chat "$llama2" '{"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]}' "message 2 is 'user': after an optional system message, roles must alternate"
expect_bad "llama2: a late system message" chat "$llama2" '{"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]}' "message 2: a system message comes first or not at all"
# invalid UTF-8, the byte named
printf '{"prompt": "a", "response": "b"}\n{"prompt": "\377", "response": "b"}\n' >"$bad"
refused "invalid UTF-8" 1 "$bad:2: invalid UTF-8 (byte 13 of the line, counting from 1)" -- \
    "$SHLM" data prepare --tokenizer bytes --format prompt-response "$bad" "$out"
# the same convention in a text file, one document, for a tokenizer that takes Unicode only
printf 'one line\nthen \377 another\n' >"$bad"
refused "invalid UTF-8 in a text file" 1 "$bad:2: " "invalid UTF-8" \
    "(byte 6 of the line, counting from 1)" -- \
    "$SHLM" data prepare --tokenizer "$chatml" --format text "$bad" "$out"
: >"$bad"
refused "empty file" 1 "$bad: empty file" -- \
    "$SHLM" data prepare --tokenizer "$chatml" --format chat "$bad" "$out"
printf '\n  \n' >"$bad"
refused "only blank lines" 1 "$bad: no records" -- \
    "$SHLM" data prepare --tokenizer bytes --format prompt-response "$bad" "$out"
printf '{"prompt": "a", "response": "b"}\n' >"$bad"
refused "unknown chat template" 2 "unknown chat template 'vicuna' (known: chatml, llama2, llama3, qwen2.5)" -- \
    "$SHLM" data prepare --tokenizer "$chatml" --format chat --chat-template vicuna "$bad" "$out"
refused "a template shardlm does not render" 1 "$other/tokenizer_config.json: its chat template is not one shardlm renders" \
    "--chat-template chatml, qwen2.5, llama2 or llama3 uses one of those" -- \
    "$SHLM" data prepare --tokenizer "$other" --format prompt-response "$bad" "$out"
refused "chat without a template" 1 "has no chat template: give --chat-template chatml, qwen2.5, llama2 or llama3" -- \
    "$SHLM" data prepare --tokenizer bytes --format chat "$bad" "$out"
refused "chatml without its tokens" 1 "the chatml chat template needs the tokens <|im_start|> and <|im_end|>" -- \
    "$SHLM" data prepare --tokenizer "$llama2" --format chat --chat-template chatml "$bad" "$out"
refused "llama2 without bos" 1 "the llama2 chat template needs a bos and an eos token" -- \
    "$SHLM" data prepare --tokenizer bytes --format chat --chat-template llama2 "$bad" "$out"
refused "template on a text format" 2 "--chat-template applies to --format prompt-response and chat" -- \
    "$SHLM" data prepare --tokenizer bytes --format text --chat-template chatml "$bad" "$out"
refused "unknown format" 2 "--format must be text, jsonl-text, prompt-response or chat, not 'csv'" -- \
    "$SHLM" data prepare --tokenizer bytes --format csv "$bad" "$out"
refused "--overlong alone" 2 "--overlong needs --max-doc-len" -- \
    "$SHLM" data prepare --tokenizer bytes --overlong drop "$bad" "$out"
refused "--max-doc-len 0" 2 "--max-doc-len: '0' is out of range, must be in [1, " -- \
    "$SHLM" data prepare --tokenizer bytes --max-doc-len 0 "$bad" "$out"
refused "info of a text file" 1 "$bad: bad magic" -- "$SHLM" data info "$bad"

# ---- a file without any trained token is a warning ----
printf '{"prompt": "aaaaaaaaaa", "response": "b"}\n' >"$work/short.jsonl"
ok "nothing trained left" "$SHLM" data prepare --tokenizer bytes --format prompt-response \
    --max-doc-len 5 "$work/short.jsonl" "$work/short.bin"
grep -q "1 documents have no trained token (the first at line 1)" "$work/err" ||
    fail "a document without trained tokens is not reported: $(cat "$work/err")"

test_end
