#!/bin/sh
# Chat templates (src/data/chat_template.c) against transformers' apply_chat_template: SmolLM2's
# ChatML template (from get-model.sh's directory), Llama-2 chat's template
# (meta-llama/Llama-2-7b-chat-hf's tokenizer_config.json, below) and Qwen2.5's
# (tests/data/qwen25_chat_template.jinja: tool-call branches, Qwen's default system prompt) render
# every conversation of a set (system or not, several turns, whitespace to strip, generation
# prompt or not, roles that do not alternate; for Qwen2.5 also every conversation of
# tests/data/chat_edge.jsonl, with and without the generation prompt) as transformers does,
# and refuse where it raises. Skipped
# (77) without a python3 that has transformers, or without the model directory
# ($SHLM_SMOLLM2, tests/pyenv.sh), whose tokenizer transformers renders with.
#   SHLM_BUILDDIR=. SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/chat_template.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM_BUILDDIR=${SHLM_BUILDDIR:-.}
. "$SHLM_SRCDIR/tests/pyenv.sh"
. "$SHLM_SRCDIR/tests/lib.sh"
shlm_python transformers jinja2 >/dev/null || skip_test "$(shlm_python transformers jinja2)"
[ -f "$SHLM_SMOLLM2/tokenizer_config.json" ] ||
    skip_test "no $SHLM_SMOLLM2 (examples/smollm2/get-model.sh makes it)"
test_begin chat_template shlm-chat
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
r="$SHLM_BUILDDIR/tests/test_chat_template"
cat >"$work/conv.json" <<'JSON'
[
 {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true},
 {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false},
 {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
  "add_generation_prompt": true},
 {"messages": [{"role": "system", "content": "  spaced system  "}, {"role": "user", "content": "\n question \t"},
               {"role": "assistant", "content": " answer \n"}, {"role": "user", "content": "again"}],
  "add_generation_prompt": true},
 {"messages": [{"role": "user", "content": "naïve café 😀\nline two"}, {"role": "assistant", "content": "ok"}],
  "add_generation_prompt": false},
 {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
  "add_generation_prompt": true},
 {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "empty system"}],
  "add_generation_prompt": true}
]
JSON
"$SHLM_PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["chat_template"], end="")' \
    "$SHLM_SMOLLM2/tokenizer_config.json" >"$work/smollm2.txt"
# meta-llama/Llama-2-7b-chat-hf, tokenizer_config.json "chat_template"
cat >"$work/llama2.txt" <<'TEMPLATE'
{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}
TEMPLATE
printf '%s' "$(cat "$work/llama2.txt")" >"$work/llama2.trim" # no final newline
# Qwen2.5's (tests/data/qwen25_chat_template.jinja, its tokenizer_config.json's text)
cp "$SHLM_SRCDIR/tests/data/qwen25_chat_template.jinja" "$work/qwen25.txt"
"$SHLM_PY" - "$work/conv.json" "$SHLM_SRCDIR/tests/data/chat_edge.jsonl" >"$work/conv_edge.json" <<'EOF'
import json, sys
convs = json.load(open(sys.argv[1], encoding="utf-8"))
for line in open(sys.argv[2], encoding="utf-8"):
    for gen in (False, True):
        convs.append({"messages": json.loads(line)["messages"], "add_generation_prompt": gen})
json.dump(convs, sys.stdout)
EOF
for t in smollm2 llama2 qwen25; do
    src="$work/$t.txt" conv="$work/conv.json"
    [ $t = llama2 ] && src="$work/llama2.trim"
    [ $t = qwen25 ] && conv="$work/conv_edge.json"
    echo "+ $r render $src '<s>' '</s>' $conv"
    if ! "$r" render "$src" '<s>' '</s>' "$conv" >"$work/$t.json" 2>"$work/$t.err"; then
        cat "$work/$t.err"
        fail "$t: test_chat_template render failed"
        continue
    fi
    ref=-
    [ $t = llama2 ] && ref="$work/llama2.trim"
    [ $t = qwen25 ] && ref="$work/qwen25.txt"
    echo "+ $SHLM_PY $SHLM_SRCDIR/tests/chat_template_render_ref.py $SHLM_SMOLLM2 $ref '<s>' '</s>' ..."
    "$SHLM_PY" "$SHLM_SRCDIR/tests/chat_template_render_ref.py" "$SHLM_SMOLLM2" "$ref" '<s>' '</s>' \
        "$conv" "$work/$t.json" || fail "$t: renderings differ from transformers'"
done
test_end
