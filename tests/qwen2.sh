#!/bin/sh
# The qwen2 family (src/model/qwen2/) against Hugging Face transformers, on a tiny random
# Qwen2ForCausalLM that transformers' save_pretrained writes (Qwen2Config: GQA 4 query / 2
# kv heads, q/k/v biases drawn away from 0, norm weights away from 1, tied embeddings, RoPE
# base 1e6, vocabulary 151,936, so every token file holds 4-byte ids):
#  1. model.init_from with no [model] keys makes it a qwen2 model with q/k/v biases; eval's
#     mean loss over the validation windows equals transformers' fp32 loss over the same
#     windows within 1e-4, and generate's greedy tokens (through the KV cache, the biases
#     added to each new token's q/k/v) equal transformers' generate;
#     with a tokenizer that has no chat template (tests/sft_data.py's byte-level one with
#     <|im_start|> and <|im_end|>), generate --chat renders the prompt with the family's,
#     Qwen2.5's: its ids equal transformers' apply_chat_template under Qwen2.5's template;
#  2. training it gives the same losses and gradient norms (fp32, within 1e-6 relative) on
#     1 rank (accumulating 4 micro-batches), 4 ranks FULL_SHARD (accumulating 2) and 4
#     ranks HYBRID_SHARD 2 x 2;
#  3. 4 steps, a checkpoint, and a resume to 8 give steps 5-8 and the step-8 state bit for
#     bit those of 8 straight steps; the checkpoint holds the biases and says qwen2;
#     `ckpt export` writes Qwen2ForCausalLM, which transformers loads back to shardlm's
#     eval loss of the checkpoint within 1e-4 and to its greedy tokens;
#  4. bad input, one error line each, nothing run: a config.json with use_sliding_window
#     true (naming the key), one with a sliding_attention layer, one whose architecture no
#     family claims (naming the architectures the families read), and qkv_bias = false.
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/qwen2.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher, or no Python with torch and transformers:
# tests/setup_pyenv.sh installs them). The work directory is kept on failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
. "$SHLM_SRCDIR/tests/lib.sh"
. "$SHLM_SRCDIR/tests/pyenv.sh"
if ! shlm_python torch transformers safetensors >/dev/null; then
    skip_test "$(shlm_python torch transformers safetensors)"
fi
test_begin qwen2 shlm-qwen2
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1

# ---- the fixture ----
hf="$work/hf"
echo "+ $SHLM_PY - $hf  (Qwen2Config, Qwen2ForCausalLM.save_pretrained)"
"$SHLM_PY" - "$hf" >"$work/fixture.log" 2>&1 <<'EOF' || { cat "$work/fixture.log"; fail "cannot make the fixture"; test_end; }
import sys
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=151936, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  initializer_range=0.2, use_sliding_window=False)
m = Qwen2ForCausalLM(cfg).float()
with torch.no_grad():
    for layer in m.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            proj.bias.normal_(0, 0.5)
        layer.input_layernorm.weight.normal_(1, 0.2)
        layer.post_attention_layernorm.weight.normal_(1, 0.2)
m.save_pretrained(sys.argv[1])
EOF
"$SHLM" data random --vocab 151936 --tokens 4000 "$work/train.bin" >/dev/null || exit 1
"$SHLM" data random --vocab 151936 --tokens 129 "$work/val.bin" >/dev/null || exit 1
if "$SHLM" data info "$work/val.bin" | grep -q "width *4 bytes"; then
    echo "qwen2: ok: token files of vocabulary 151,936 hold 4-byte ids"
else
    fail "the token file of vocabulary 151,936 does not hold 4-byte ids"
fi

# reference DIR: transformers on the Hugging Face directory DIR: "CLASS LOSS IDS...", the
# fp32 mean loss over val.bin's windows of 32 tokens as shardlm cuts them (window w: tokens
# 32w .. 32w + 32) and the 8 greedy tokens after the prompt 1, 2, 3
reference() {
    SHLM_TESTS="$SHLM_SRCDIR/tests" "$SHLM_PY" - "$1" "$work/val.bin" 2>"$work/reference.err" <<'EOF'
import os, sys
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
sys.path.insert(0, os.environ["SHLM_TESTS"])
import sft_data
ids = sft_data.read(sys.argv[2])[1]
n = len(ids)
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
T, total, count = 32, 0.0, 0
with torch.no_grad():
    for w in range((n - 1) // T):
        x = torch.tensor(ids[w * T:w * T + T + 1])[None]
        total += F.cross_entropy(m(x[:, :-1]).logits[0].double(), x[0, 1:], reduction="sum").item()
        count += T
    out = m.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=8, do_sample=False,
                     eos_token_id=None, pad_token_id=0)
print(type(m).__name__, f"{total / count:.6f}", *(int(v) for v in out[0, 3:]))
EOF
}
# go NAME NP CMD...: runs shardlm CMD on NP ranks (1: without a launcher), stdout in
# $work/NAME.log, stderr in $work/NAME.err; a failure is reported and returned
go() {
    name=$1 np=$2
    shift 2
    if [ "$np" -eq 1 ]; then
        echo "+ $SHLM $*"
        "$SHLM" "$@" >"$work/$name.log" 2>"$work/$name.err" </dev/null
    else
        echo "+ sh $mpi $np $SHLM $*"
        sh "$mpi" "$np" "$SHLM" "$@" >"$work/$name.log" 2>"$work/$name.err" </dev/null
    fi
    rc=$?
    skip_without_launcher $rc
    if [ $rc -ne 0 ]; then
        tail -n 5 "$work/$name.err" "$work/$name.log"
        fail "$name: exit $rc"
    fi
    return $rc
}
# compare WHAT SHARDLM_LOSS SHARDLM_IDS REFERENCE_LINE: loss within 1e-4, the same tokens
compare() {
    set -- "$1" "$2" "$3" $4
    what=$1 loss=$2 ids=$3 class=$4 ref_loss=$5
    shift 5
    if [ "$class" != Qwen2ForCausalLM ]; then
        fail "$what: transformers loads a $class, not a Qwen2ForCausalLM"
    elif awk -v a="$loss" -v b="$ref_loss" 'BEGIN { d = a - b; exit !(d < 1e-4 && d > -1e-4) }'; then
        echo "qwen2: ok: $what: eval loss $loss, transformers' $ref_loss"
    else
        fail "$what: eval loss $loss, transformers' $ref_loss (more than 1e-4 apart)"
    fi
    if [ "$ids" = "$*" ]; then
        echo "qwen2: ok: $what: greedy tokens equal transformers': $ids"
    else
        fail "$what: greedy tokens $ids, transformers' $*"
    fi
}
# shardlm_says NAME: "LOSS|IDS" of the eval run NAME and the generate run NAME.gen
shardlm_says() {
    l=$(sed -n 's/.*mean loss \([0-9.]*\) nats.*/\1/p' "$work/$1.log")
    i=$(sed -n 's/^generated ids: //p' "$work/$1.gen.log")
    grep -q '^generate: KV cache: ' "$work/$1.gen.log" || i="(not through the KV cache) $i"
    echo "$l|$i"
}

# ---- 1. init_from with no [model] keys ----
printf '[model]\ninit_from = %s\n[train]\nseq_len = 32\n[data]\nval = %s\n[log]\nrun_dir = %s\n[runtime]\nbackend = cpu\nthreads = 1\n' \
    "$hf" "$work/val.bin" "$work/run.eval" >"$work/eval.ini"
go eval 1 eval "$work/eval.ini" &&
    go eval.gen 1 generate "$work/eval.ini" --prompt-ids 1,2,3 --tokens 8 --temperature 0 --ids
if [ "$fails" -eq 0 ]; then
    if grep -q "model.family *= qwen2" "$work/eval.log" &&
        grep -q "model.qkv_bias *= true" "$work/eval.log"; then
        echo "qwen2: ok: init_from's config.json makes a qwen2 model with qkv_bias true"
    else
        fail "eval's resolved configuration does not say model.family = qwen2, qkv_bias = true"
    fi
    ref=$(reference "$hf") || { cat "$work/reference.err"; fail "transformers' reference failed"; }
    said=$(shardlm_says eval)
    compare "init_from" "${said%%|*}" "${said#*|}" "$ref"
fi

# the family's chat template where the tokenizer has none
chat="$work/chat"
mkdir -p "$chat"
python3 "$SHLM_SRCDIR/tests/sft_data.py" tokenizers "$work/tk" || fail "sft_data.py tokenizers"
cp "$hf/config.json" "$work/tk/chatml/tokenizer.json" "$chat/"
ln -s "$hf/model.safetensors" "$chat/model.safetensors"
printf '{"eos_token": "<|im_end|>"}\n' >"$chat/tokenizer_config.json"
prompt="Hi there, café"
# the rendering (Qwen's default system message and all) is longer than eval.ini's context
if go chat.gen 1 generate "$work/eval.ini" --set "model.init_from=$chat" --set train.seq_len=128 \
    --chat --prompt "$prompt" --tokens 0 --ids; then
    got=$(sed -n 's/^prompt ids: //p' "$work/chat.gen.log")
    want=$("$SHLM_PY" - "$chat" "$SHLM_SRCDIR/tests/data/qwen25_chat_template.jinja" "$prompt" \
        2>"$work/chat.ref.err" <<'EOF'
import sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok.apply_chat_template([{"role": "user", "content": sys.argv[3]}], tokenize=True,
                              chat_template=open(sys.argv[2], encoding="utf-8").read(),
                              add_generation_prompt=True, return_dict=False)
print(*ids)
EOF
    ) || { cat "$work/chat.ref.err"; fail "transformers' apply_chat_template failed"; }
    if [ -n "$got" ] && [ "$got" = "$want" ]; then
        echo "qwen2: ok: generate --chat with no tokenizer template: Qwen2.5's rendering, $(echo "$got" | wc -w) ids as transformers'"
    else
        fail "generate --chat with no tokenizer template: ids '$got', transformers' under Qwen2.5's template '$want'"
    fi
fi

# ---- 2. 1 rank = 4 ranks FULL_SHARD = 4 ranks HYBRID_SHARD 2 x 2 ----
printf '[model]\ninit_from = %s\n[train]\nseq_len = 16\nglobal_batch = 8\nsteps = 8\nlr = 1e-3\nwarmup_steps = 2\nseed = 7\n[data]\ntrain = %s\nval = %s\n[log]\nevery = 1\n[runtime]\nbackend = cpu\nthreads = 1\n' \
    "$hf" "$work/train.bin" "$work/val.bin" >"$work/train.ini"
train() {
    name=$1 np=$2
    shift 2
    go "$name" "$np" train "$work/train.ini" --set "log.run_dir=$work/$name" "$@"
}
# column RUN KEY: "step value" of every step of RUN's metrics.jsonl
column() {
    sed -n "s/.*\"step\": \([0-9]*\),.*\"$2\": \([^,}]*\).*/\1 \2/p" "$work/$1/metrics.jsonl"
}
train one 1 --set train.micro_batch=2 --set "checkpoint.dir=$work/ck.one"
train full 4 --set train.micro_batch=1 --set fsdp.strategy=FULL_SHARD
train hybrid 4 --set train.micro_batch=2 --set fsdp.strategy=HYBRID_SHARD \
    --set runtime.ranks_per_node=2
for run in full hybrid; do
    for key in loss grad_norm; do
        column one $key >"$work/one.$key"
        column $run $key >"$work/$run.$key"
        rel=$(awk 'FNR == NR { ref[$1] = $2; next }
            { n++; a = ref[$1] + 0; d = a - $2; if (d < 0) d = -d; if (a < 0) a = -a
              if (d / a > m) m = d / a }
            END { if (n != 8) print "missing"; else printf "%.2e\n", m }' "$work/one.$key" "$work/$run.$key")
        if [ "$rel" = missing ] || awk -v r="$rel" 'BEGIN { exit !(r > 1e-6) }'; then
            fail "$run: the $key of 8 steps differs from 1 rank's by $rel (tolerance 1e-6)"
        else
            echo "qwen2: ok: $run (4 ranks): the $key of 8 steps within $rel of 1 rank's"
        fi
    done
done

# ---- 3. checkpoint, resume, export ----
train half 1 --set train.micro_batch=2 --set "checkpoint.dir=$work/ck.half" --set train.stop_after=4
train rest 1 --set train.micro_batch=2 --set "checkpoint.dir=$work/ck.half"
for key in loss grad_norm; do
    column one $key | awk '$1 > 4' >"$work/one.late.$key"
    column rest $key >"$work/rest.$key"
    if [ "$(wc -l <"$work/rest.$key")" -ne 4 ] || ! cmp -s "$work/one.late.$key" "$work/rest.$key"; then
        diff "$work/one.late.$key" "$work/rest.$key" | head -n 6
        fail "the $key of steps 5-8 after the resume differ from 8 straight steps"
    fi
done
"$SHLM" ckpt info "$work/ck.one" >"$work/one.info" 2>&1
"$SHLM" ckpt info "$work/ck.half" >"$work/half.info" 2>&1
grep ' 0x' "$work/one.info" >"$work/one.sums"
grep ' 0x' "$work/half.info" >"$work/half.sums"
if [ ! -s "$work/one.sums" ] || ! cmp -s "$work/one.sums" "$work/half.sums"; then
    diff "$work/one.sums" "$work/half.sums" | head -n 6
    fail "the step-8 state after the resume differs from 8 straight steps"
else
    echo "qwen2: ok: steps 5-8 and the step-8 state ($(wc -l <"$work/one.sums") dataset checksums) bit for bit after a resume"
fi
if grep -q "qwen2" "$work/one.info" && grep -q "qkv_bias *true" "$work/one.info" &&
    grep -q "model.layers.1.self_attn.v_proj.bias" "$work/one.info"; then
    echo "qwen2: ok: the checkpoint says qwen2, qkv_bias true, and holds the biases"
else
    fail "ckpt info does not show the family qwen2, qkv_bias true and the bias tensors"
fi
go export 1 ckpt export "$work/ck.one" "$work/exp" &&
    go ck.eval 1 eval "$work/eval.ini" --ckpt "$work/ck.one" &&
    go ck.eval.gen 1 generate "$work/eval.ini" --ckpt "$work/ck.one" --prompt-ids 1,2,3 \
        --tokens 8 --temperature 0 --ids
if [ "$fails" -eq 0 ]; then
    ref=$(reference "$work/exp") || { cat "$work/reference.err"; fail "transformers cannot load the export"; }
    said=$(shardlm_says ck.eval)
    compare "the export of the trained checkpoint" "${said%%|*}" "${said#*|}" "$ref"
fi

# ---- 4. bad input ----
# bad NAME SED-PROGRAM PATTERN...: init_from a copy of the fixture whose config.json went
# through SED-PROGRAM is refused with one line naming every PATTERN
bad() {
    name=$1 prog=$2
    shift 2
    mkdir -p "$work/$name"
    ln -s "$hf/model.safetensors" "$work/$name/model.safetensors"
    sed "$prog" "$hf/config.json" >"$work/$name/config.json"
    "$SHLM" eval "$work/eval.ini" --set "model.init_from=$work/$name" --set "log.run_dir=$work/$name.run" \
        >"$work/$name.log" 2>"$work/$name.err" </dev/null
    refused_before_step1 "$name" $? "$@"
}
bad sliding 's/"use_sliding_window": false/"use_sliding_window": true/' \
    "$work/sliding/config.json" "use_sliding_window = true"
bad layer_types '0,/"full_attention"/s/"full_attention"/"sliding_attention"/' \
    "$work/layer_types/config.json" "layer_types[0] = sliding_attention"
bad mistral 's/Qwen2ForCausalLM/MistralForCausalLM/; s/"qwen2"/"mistral"/' \
    "$work/mistral/config.json" '"MistralForCausalLM" is not one shardlm implements' \
    "LlamaForCausalLM (llama)" "Qwen2ForCausalLM (qwen2)"
"$SHLM" eval "$work/eval.ini" --set model.qkv_bias=false --set "log.run_dir=$work/nobias.run" \
    >"$work/nobias.log" 2>"$work/nobias.err" </dev/null
refused_before_step1 nobias $? "--set model.qkv_bias" "qkv_bias = false"

test_end
