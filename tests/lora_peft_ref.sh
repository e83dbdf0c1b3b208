#!/bin/sh
# PEFT adapters into shardlm: tests/lora_peft_ref.py makes three adapters of
# SmolLM2-135M-Instruct with Hugging Face PEFT's get_peft_model (random non-zero A, B and
# DoRA magnitudes) and saves them with save_pretrained: r 8 / alpha 16 on all seven
# projections, r 4 with use_rslora on q and v, and a DoRA adapter of r 4 on q, k, o and
# down. shardlm's eval with model.init_from = the model and lora.init_from = each adapter
# must give PEFT's fp32 loss on the same ids (one window: the whole text) to 1e-4 relative.
# Then one error line each, before any pass, for an adapter_config.json without r, one
# without lora_alpha (PEFT's defaults would change the scale) and an adapter whose tensors
# do not fit the base (its config saying r 4 over tensors of rank 8).
# Skipped (77) without a python3 that has torch, transformers and numpy, without peft in
# $SHLM_PEFT or without the model directory ($SHLM_SMOLLM2; tests/pyenv.sh). Minutes on 2
# cores (three model loads in python, three evals of 135M parameters).
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/lora_peft_ref.sh
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}

. "$SHLM_SRCDIR/tests/pyenv.sh"
. "$SHLM_SRCDIR/tests/lib.sh"

shlm_python torch transformers numpy >/dev/null || skip_test "$(shlm_python torch transformers numpy)"
[ -d "$SHLM_PEFT/peft" ] || skip_test "no peft in $SHLM_PEFT (run tests/setup_pyenv.sh)"
model=$SHLM_SMOLLM2
[ -f "$model/config.json" ] && [ -f "$model/model.safetensors" ] ||
    skip_test "no $model (examples/smollm2/get-model.sh $model makes it)"

test_begin lora_peft_ref shlm-lora-peft
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1

head -c 3000 "$SHLM_SRCDIR/jobs/data/shakespeare-val.txt" >"$work/text.txt"
step prepare "$SHLM" data prepare --tokenizer "$model" "$work/text.txt" "$work/text.bin" || exit 1
cat >"$work/ref.ini" <<JOB
[model]
init_from = $model
[data]
train = $work/text.bin
val = $work/text.bin
[log]
run_dir = $work/run
[runtime]
backend = cpu
JOB

mkdir -p "$work/peft"
echo "+ PYTHONPATH=$SHLM_PEFT $SHLM_PY $SHLM_SRCDIR/tests/lora_peft_ref.py $model $work/text.bin $work/peft"
PYTHONPATH="$SHLM_PEFT${PYTHONPATH:+:$PYTHONPATH}" "$SHLM_PY" "$SHLM_SRCDIR/tests/lora_peft_ref.py" \
    "$model" "$work/text.bin" "$work/peft" >"$work/reference.log" 2>&1 </dev/null ||
    { tail -n 15 "$work/reference.log"; fail "the PEFT reference failed"; test_end; }
grep '^loss ' "$work/reference.log"

for name in r8_all r4_rslora_qv dora_r4; do
    set -- $(sed -n "s/^loss $name //p" "$work/reference.log")
    n_ref=${1:-} l_ref=${2:-}
    step "eval_$name" "$SHLM" eval "$work/ref.ini" --set "lora.init_from=$work/peft/$name" || continue
    l=$(sed -n 's/^eval: .* mean loss \([0-9.]*\) nats.*/\1/p' "$work/eval_$name.log")
    scored=$(sed -n 's/^eval: .*: \([0-9]*\) tokens scored.*/\1/p' "$work/eval_$name.log")
    if [ -z "$l_ref" ] || [ -z "$l" ]; then
        fail "$name: no loss from shardlm ('$l') or PEFT ('$l_ref')"
        continue
    fi
    d=$(awk -v a="$l" -v b="$l_ref" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.3e", d / b }')
    if [ "$scored" != "$n_ref" ] || awk -v d="$d" 'BEGIN { exit !(d > 1e-4) }'; then
        fail "$name: shardlm $l over $scored tokens, PEFT $l_ref over $n_ref: rel $d"
    else
        echo "$test_name: ok: $name: shardlm's eval $l, PEFT's $l_ref over $scored tokens: rel diff $d"
    fi
done

# ---- bad adapters: one line each ----
# broken NAME PYTHON: a copy of r8_all whose adapter_config.json j the python line edits
broken() {
    cp -R "$work/peft/r8_all" "$work/$1"
    "$SHLM_PY" -c "import json, sys
p = sys.argv[1] + '/adapter_config.json'
j = json.load(open(p))
$2
json.dump(j, open(p, 'w'))" "$work/$1" || fail "$1: could not edit the adapter"
}
broken no_r 'del j["r"]'
broken no_alpha 'del j["lora_alpha"]'
broken misfit 'j["r"] = 4'
for c in "no_r|adapter_config.json: no r:" "no_alpha|adapter_config.json: no lora_alpha:" \
    "misfit|lora_A.weight has shape [8, 576], the model needs [4, 576]"; do
    name=${c%%|*}
    run_expecting_error "$work/$name" "${c#*|}" -- "$SHLM" eval "$work/ref.ini" \
        --set "lora.init_from=$work/$name"
    if [ "$rc" -ne 1 ] || [ -n "$why" ]; then
        fail "$name: exit $rc (want 1) $why: $(cat "$work/err")"
    elif grep -q '^eval:' "$work/out"; then
        fail "$name: evaluated before refusing"
    else
        echo "$test_name: ok: $name: $(cat "$work/err")"
    fi
done

test_end
