#!/bin/sh
# RoPE scaling (the decoder's model.rope_* keys, kernels/rope_freq.h) against Hugging Face
# transformers, on tiny random LlamaForCausalLM models that transformers' save_pretrained
# writes with rope_scaling llama3 (factor 4 over an original context of 32, so every band
# of Llama-3.1's rule holds a pair) and linear (factor 4), in windows of 256 tokens:
#  1. the scaling changes transformers' loss (the same weights without it lose more than
#     1e-3 apart), so the case tests something;
#  2. model.init_from with no [model] keys reads config.json's RoPE in each form: transformers
#     5's rope_parameters (as save_pretrained writes it), the Hub's rope_theta + rope_scaling
#     (Llama-3.1's files), and rope_scaling's older "type" (linear); eval's mean loss over the
#     validation windows equals transformers' fp32 loss within 1e-4 and generate's greedy
#     tokens after a prompt of 200 tokens equal transformers' generate;
#  3. a checkpoint of 2 training steps stores the rope keys (ckpt info), and `ckpt export`
#     writes config.json in the source's form with the same scaling, which transformers
#     loads back to shardlm's eval loss of the checkpoint within 1e-4;
#  4. bad input, one error line each, nothing run: a rope type shardlm does not implement
#     (yarn, dynamic) in config.json, naming it; model.rope_type = yarn; a llama3 type
#     without its low_freq_factor, naming the key; a rope_factor with the default type;
#     rope scaling on the qwen2 family;
#  5. generation_config.json's list of eos ids (a byte-level tokenizer.json of the model's
#     256 ids beside it): generate's greedy tokens end at whichever member comes first.
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/llama3_rope.sh
# Exit 0 pass, 1 fail, 77 skip (no Python with torch, transformers and tokenizers:
# tests/setup_pyenv.sh installs them). The work directory is kept on failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
. "$SHLM_SRCDIR/tests/lib.sh"
. "$SHLM_SRCDIR/tests/pyenv.sh"
if ! shlm_python torch transformers safetensors tokenizers >/dev/null; then
    skip_test "$(shlm_python torch transformers safetensors tokenizers)"
fi
test_begin llama3_rope shlm-llama3-rope
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1

# ---- the fixtures: one set of weights, saved with each scaling ----
echo "+ $SHLM_PY - $work  (LlamaConfig(rope_scaling=...), LlamaForCausalLM.save_pretrained)"
"$SHLM_PY" - "$work" >"$work/fixture.log" 2>&1 <<'EOF' || { cat "$work/fixture.log"; fail "cannot make the fixtures"; test_end; }
import json, os, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
work = sys.argv[1]
scalings = {
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "none": None,
}
torch.manual_seed(0)
state = None
for name, scaling in scalings.items():
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.2,
                      rope_scaling=scaling, bos_token_id=1, eos_token_id=2)
    m = LlamaForCausalLM(cfg).float()
    if state is None:
        with torch.no_grad():
            for layer in m.model.layers:
                layer.input_layernorm.weight.normal_(1, 0.2)
                layer.post_attention_layernorm.weight.normal_(1, 0.2)
        state = m.state_dict()
    m.load_state_dict(state)
    m.save_pretrained(os.path.join(work, name))
# the Hub's form of the same models: rope_theta and rope_scaling at the top (Llama-3.1's
# config.json), and rope_scaling's older "type" member (linear)
for name, src, scaling in (("llama3-hub", "llama3", dict(scalings["llama3"])),
                           ("linear-type", "linear", {"type": "linear", "factor": 4.0})):
    c = json.load(open(os.path.join(work, src, "config.json")))
    rp = c.pop("rope_parameters")
    c["rope_theta"], c["rope_scaling"] = rp["rope_theta"], scaling
    os.makedirs(os.path.join(work, name))
    json.dump(c, open(os.path.join(work, name, "config.json"), "w"), indent=2)
    os.symlink(os.path.join(work, src, "model.safetensors"),
               os.path.join(work, name, "model.safetensors"))
EOF
"$SHLM" data random --vocab 256 --tokens 4000 "$work/train.bin" >/dev/null || exit 1
"$SHLM" data random --vocab 256 --tokens 1025 --seed 3 "$work/val.bin" >/dev/null || exit 1
prompt=$(seq 5 204 | awk '{ printf "%s%d", (NR > 1 ? "," : ""), ($1 * 37) % 250 + 3 }')

# reference DIR: transformers on the Hugging Face directory DIR: "LOSS IDS...", the fp32
# mean loss over val.bin's windows of 256 tokens as shardlm cuts them (window w: tokens
# 256w .. 256w + 256) and the 8 greedy tokens after the prompt
reference() {
    SHLM_TESTS="$SHLM_SRCDIR/tests" "$SHLM_PY" - "$1" "$work/val.bin" "$prompt" 2>"$work/reference.err" <<'EOF'
import os, sys
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
sys.path.insert(0, os.environ["SHLM_TESTS"])
import sft_data
ids = sft_data.read(sys.argv[2])[1]
n = len(ids)
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
T, total, count = 256, 0.0, 0
with torch.no_grad():
    for w in range((n - 1) // T):
        x = torch.tensor(ids[w * T:w * T + T + 1])[None]
        total += F.cross_entropy(m(x[:, :-1]).logits[0].double(), x[0, 1:], reduction="sum").item()
        count += T
    p = [int(v) for v in sys.argv[3].split(",")]
    out = m.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                     pad_token_id=0)
print(f"{total / count:.6f}", *(int(v) for v in out[0, len(p):]))
EOF
}
# go NAME CMD...: runs shardlm CMD (the command echoed on stderr), stdout in
# $work/NAME.log, stderr in $work/NAME.err; a failure is reported and returned
go() {
    name=$1
    shift
    echo "+ $SHLM $*" >&2
    "$SHLM" "$@" >"$work/$name.log" 2>"$work/$name.err" </dev/null
    rc=$?
    if [ $rc -ne 0 ]; then
        tail -n 5 "$work/$name.err" "$work/$name.log"
        fail "$name: exit $rc"
    fi
    return $rc
}
# compare WHAT SHARDLM_LOSS SHARDLM_IDS REFERENCE_LINE: loss within 1e-4, the same tokens
compare() {
    set -- "$1" "$2" "$3" $4
    what=$1 loss=$2 ids=$3 ref_loss=$4
    shift 4
    if awk -v a="$loss" -v b="$ref_loss" 'BEGIN { d = a - b; exit !(a != "" && d < 1e-4 && d > -1e-4) }'; then
        echo "$test_name: ok: $what: eval loss $loss, transformers' $ref_loss"
    else
        fail "$what: eval loss '$loss', transformers' $ref_loss (more than 1e-4 apart)"
    fi
    if [ -n "$ids" ] && [ "$ids" = "$*" ]; then
        echo "$test_name: ok: $what: greedy tokens equal transformers': $ids"
    else
        fail "$what: greedy tokens '$ids', transformers' $*"
    fi
}
# eval_and_generate NAME ARGS...: eval (NAME) and 8 greedy tokens (NAME.gen); prints "LOSS|IDS"
eval_and_generate() {
    n=$1
    shift
    go "$n" eval "$work/eval.ini" --set "log.run_dir=$work/$n.run" "$@" &&
        go "$n.gen" generate "$work/eval.ini" "$@" --prompt-ids "$prompt" --tokens 8 \
            --temperature 0 --ids || return 1
    l=$(sed -n 's/.*mean loss \([0-9.]*\) nats.*/\1/p' "$work/$n.log")
    i=$(sed -n 's/^generated ids: //p' "$work/$n.gen.log")
    echo "$l|$i"
}
printf '[train]\nseq_len = 256\n[data]\nval = %s\n[runtime]\nbackend = cpu\nthreads = 1\n' \
    "$work/val.bin" >"$work/eval.ini"
printf '[train]\nseq_len = 256\nglobal_batch = 2\nsteps = 2\nlr = 1e-3\nseed = 7\n[data]\ntrain = %s\nval = %s\n[runtime]\nbackend = cpu\nthreads = 1\n' \
    "$work/train.bin" "$work/val.bin" >"$work/train.ini"

# ---- 1. the scaling changes the loss ----
ref_none=$(reference "$work/none") || { cat "$work/reference.err"; fail "transformers' reference failed"; test_end; }
for v in llama3 linear; do
    ref=$(reference "$work/$v") || { cat "$work/reference.err"; fail "transformers' reference failed"; continue; }
    eval "ref_$v=\$ref"
    set -- $ref_none
    a=$1
    set -- $ref
    if awk -v a="$a" -v b="$1" 'BEGIN { d = a - b; exit !(d > 1e-3 || d < -1e-3) }'; then
        echo "$test_name: ok: $v scaling moves transformers' loss from $a to $1"
    else
        fail "$v: transformers' loss with the scaling ($1) is within 1e-3 of the loss without ($a): the case tests nothing"
    fi
done

# ---- 2. init_from in each form ----
# form NAME WEIGHTS: NAME's directory against transformers' reference of WEIGHTS' scaling
for f in llama3:llama3:rope_parameters llama3-hub:llama3:rope_scaling linear:linear:rope_parameters \
    linear-type:linear:rope_scaling; do
    dir=${f%%:*} rest=${f#*:}
    kind=${rest%%:*} form=${rest#*:}
    said=$(eval_and_generate "$dir" --set "model.init_from=$work/$dir") || continue
    eval "ref=\$ref_$kind"
    grep -q "model.rope_type *= $kind" "$work/$dir.log" ||
        fail "$dir: eval's resolved configuration does not say model.rope_type = $kind"
    compare "$dir ($form)" "${said%%|*}" "${said#*|}" "$ref"
done

# ---- 3. checkpoint and export, in the source's form ----
for f in llama3:llama3 llama3-hub:llama3 linear-type:linear; do
    dir=${f%%:*} kind=${f#*:}
    go "$dir.train" train "$work/train.ini" --set "model.init_from=$work/$dir" \
        --set "log.run_dir=$work/$dir.trun" --set "checkpoint.dir=$work/$dir.ck" || continue
    "$SHLM" ckpt info "$work/$dir.ck" >"$work/$dir.info" 2>&1
    if grep -q "rope_type *$kind" "$work/$dir.info" && grep -q "rope_factor *4" "$work/$dir.info"; then
        echo "$test_name: ok: $dir: the checkpoint says rope_type $kind, rope_factor 4"
    else
        fail "$dir: ckpt info does not show rope_type $kind and rope_factor 4"
    fi
    go "$dir.export" ckpt export "$work/$dir.ck" "$work/$dir.exp" || continue
    said=$(eval_and_generate "$dir.ckeval" --ckpt "$work/$dir.ck" --set "model.init_from=$work/$dir") ||
        continue
    "$SHLM_PY" - "$work/$dir/config.json" "$work/$dir.exp/config.json" >"$work/$dir.form" 2>&1 <<'EOF'
import json, sys
src, exp = (json.load(open(p)) for p in sys.argv[1:3])
keys = ("rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
        "original_max_position_embeddings", "rope_theta")
def rope(c):
    return {k: (o.get(m) or {}).get(k) for o, m in ((c, "rope_scaling"), (c, "rope_parameters"))
            for k in keys} | {"top_theta": c.get("rope_theta"),
                              "members": sorted(k for k in ("rope_scaling", "rope_parameters") if c.get(k) is not None)}
a, b = rope(src), rope(exp)
print("same" if a == b else f"source {a}, export {b}")
EOF
    if [ "$(cat "$work/$dir.form")" = same ]; then
        echo "$test_name: ok: $dir: the export's config.json holds the source's RoPE members in its form"
    else
        fail "$dir: the export's RoPE members differ from the source's: $(cat "$work/$dir.form")"
    fi
    ref=$(reference "$work/$dir.exp") || { cat "$work/reference.err"; fail "$dir: transformers cannot load the export"; continue; }
    compare "$dir: the export of the trained checkpoint" "${said%%|*}" "${said#*|}" "$ref"
done

# ---- 4. bad input ----
# bad NAME SED-PROGRAM PATTERN...: init_from a copy of llama3-hub whose config.json went
# through SED-PROGRAM is refused with one line naming every PATTERN
bad() {
    name=$1 prog=$2
    shift 2
    mkdir -p "$work/$name"
    ln -s "$work/llama3/model.safetensors" "$work/$name/model.safetensors"
    sed "$prog" "$work/llama3-hub/config.json" >"$work/$name/config.json"
    "$SHLM" eval "$work/eval.ini" --set "model.init_from=$work/$name" --set "log.run_dir=$work/$name" \
        >"$work/$name.log" 2>"$work/$name.err" </dev/null
    refused_before_step1 "$name" $? "$@"
}
bad yarn 's/"llama3"/"yarn"/' "$work/yarn/config.json" 'rope_scaling.rope_type "yarn" is not supported' \
    "default linear llama3"
bad dynamic 's/"llama3"/"dynamic"/' "$work/dynamic/config.json" '"dynamic" is not supported'
bad nolow '/"low_freq_factor"/d' "$work/nolow/config.json" "low_freq_factor must be > 0"
# job keys: eval with a preset-free tiny shape
keys="--set model.dim=64 --set model.n_layers=1 --set model.n_heads=4 --set model.ffn_dim=96 --set model.vocab_size=256"
job_bad() {
    name=$1 sets=$2
    shift 2
    # shellcheck disable=SC2086
    "$SHLM" eval "$work/eval.ini" $keys $sets --set "log.run_dir=$work/$name" \
        >"$work/$name.log" 2>"$work/$name.err" </dev/null
    refused_before_step1 "$name" $? "$@"
}
job_bad type_yarn "--set model.rope_type=yarn" "model.rope_type" "yarn" "default|linear|llama3"
job_bad key_nolow "--set model.rope_type=llama3 --set model.rope_factor=8 --set model.rope_high_freq_factor=4 --set model.rope_original_max_position_embeddings=8192" \
    "[model] rope_type llama3: rope_low_freq_factor must be > 0"
job_bad key_unused "--set model.rope_factor=8" "--set model.rope_factor" \
    "[model] rope_factor = 8 is not used by rope_type default"
job_bad qwen2_scaled "--set model.family=qwen2 --set model.rope_type=linear --set model.rope_factor=2" \
    "--set model.rope_type" "rope_type = linear: the qwen2 family takes plain RoPE only"

# ---- 5. generation_config.json's eos ids all end a generation ----
# a byte-level tokenizer.json of the model's 256 ids whose generation_config.json lists
# three eos ids; the greedy continuation of the llama3 fixture stops at its third token
# whichever member of the list that token is
"$SHLM_PY" - "$work/tok" <<'EOF' >"$work/tok.log" 2>&1 || { cat "$work/tok.log"; fail "cannot make the tokenizer"; }
import os, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())},
                           merges=[]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
os.makedirs(sys.argv[1])
tok.save(os.path.join(sys.argv[1], "tokenizer.json"))
EOF
if [ -z "${ref_llama3:-}" ]; then
    fail "eos ids: no transformers reference of the llama3 fixture"
else
    set -- $ref_llama3
    shift
    third=$3
    want="$1 $2 $3"
    [ "$1" = "$third" ] && want=$1
    [ "$1" != "$third" ] && [ "$2" = "$third" ] && want="$1 $2"
    others=""
    for v in 3 5 7 11 13; do
        case " $1 $2 $3 " in *" $v "*) ;; *) others="$others $v" ;; esac
    done
    set -- $others
    for list in "$third, $1, $2" "$1, $third, $2" "$1, $2, $third"; do
        printf '{"eos_token_id": [%s]}\n' "$list" >"$work/tok/generation_config.json"
        go eos.gen generate "$work/eval.ini" --set "model.init_from=$work/llama3" \
            --set "data.tokenizer=$work/tok" --prompt-ids "$prompt" --tokens 8 --temperature 0 --ids ||
            continue
        got=$(sed -n 's/^generated ids: //p' "$work/eos.gen.log")
        if [ "$got" = "$want" ] && grep -q "ended at an eos" "$work/eos.gen.log"; then
            echo "$test_name: ok: eos ids [$list]: the greedy tokens end at $third: $got"
        else
            fail "eos ids [$list]: generated '$got', want '$want' ending at an eos"
        fi
    done
fi

test_end
