#!/bin/sh
# `shardlm ckpt export` of LoRA checkpoints, against Hugging Face transformers and PEFT
# (tests/lora_export.py). On a tiny random Llama that transformers saved (the base), three
# adapters train 3 steps on 1 rank: LoRA r 4 / alpha 16 on all seven projections (dropout
# 0.05 in training), rsLoRA r 4 on q and v, DoRA r 4 on q, k, o and down. For each, `shardlm
# eval` of the checkpoint beside its base gives the loss L; then
#  1. `ckpt export CKPT OUT` writes a PEFT adapter: PeftModel.from_pretrained(base, OUT)'s
#     fp32 loss on the same windows is L within 1e-4 (relative); adapter_config.json says
#     r, lora_alpha, lora_dropout, target_modules, use_rslora, use_dora and the base's path;
#     its tensors are those PEFT's own save_pretrained writes for that config (names,
#     shapes, fp32: DoRA's magnitude key included);
#  2. shardlm's eval with lora.init_from = OUT (the adapter read back) gives L within 1e-6;
#  3. `ckpt export --merged CKPT OUT` writes the model with the adapters merged:
#     transformers' fp32 loss of it is L within 1e-4; the DoRA case names its base with
#     --base (a copy of it elsewhere); the merged export into the LoRA case's PEFT
#     directory removes the adapter's files (transformers would load them as an adapter)
#     and a PEFT export over a model's directory removes the model's weights; the merged
#     tensors equal PEFT's merge_and_unload within 1e-6 of each tensor's largest value;
# and one error line each: --merged with another base (naming both fingerprints), an
# export into a regular file, --dtype for a PEFT adapter, and (with h5py) a format-5
# checkpoint, which does not hold lora.alpha.
# Skipped (77) without a python3 that has torch, transformers, safetensors and numpy, or
# without peft in $SHLM_PEFT (tests/pyenv.sh).
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/lora_export.sh
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}

. "$SHLM_SRCDIR/tests/pyenv.sh"
. "$SHLM_SRCDIR/tests/lib.sh"

shlm_python torch transformers safetensors numpy >/dev/null ||
    skip_test "$(shlm_python torch transformers safetensors numpy)"
[ -d "$SHLM_PEFT/peft" ] || skip_test "no peft in $SHLM_PEFT (run tests/setup_pyenv.sh)"

test_begin lora_export shlm-lora-export
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1
py() {
    PYTHONPATH="$SHLM_PEFT${PYTHONPATH:+:$PYTHONPATH}" "$SHLM_PY" "$SHLM_SRCDIR/tests/lora_export.py" "$@"
}

base=$work/base
echo "+ $SHLM_PY $SHLM_SRCDIR/tests/lora_export.py make $base $work/other"
py make "$base" "$work/other" >"$work/make.log" 2>&1 </dev/null ||
    { tail -n 15 "$work/make.log"; fail "cannot make the base"; test_end; }
step train_data "$SHLM" data random --vocab 256 --tokens 4000 "$work/train.bin" || test_end
step val_data "$SHLM" data random --vocab 256 --tokens 257 --seed 3 "$work/val.bin" || test_end
T=64
printf '[model]\ninit_from = %s\n[train]\nseq_len = %d\nglobal_batch = 2\nsteps = 3\nlr = 2e-2\nseed = 7\n[data]\ntrain = %s\nval = %s\n[runtime]\nbackend = cpu\nthreads = 1\n' \
    "$base" "$T" "$work/train.bin" "$work/val.bin" >"$work/job.ini"

# the cases: NAME and its [lora] keys
cases="lora|--set lora.rank=4 --set lora.alpha=16 --set lora.targets=all --set lora.dropout=0.05
rslora|--set lora.rank=4 --set lora.rslora=true --set lora.targets=q,v
dora|--set lora.rank=4 --set lora.dora=true --set lora.targets=q,k,o,down"
# keys NAME: the case's [lora] keys
keys() { printf '%s\n' "$cases" | sed -n "s/^$1|//p"; }
# eval_loss LOG: the mean loss `shardlm eval` printed
eval_loss() { sed -n 's/^eval: .* mean loss \([0-9.]*\) nats.*/\1/p' "$1"; }
# within A B TOL: |A - B| <= TOL * |B|
within() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b
    exit !(a != "" && d <= t * b) }'; }

mkdir "$work/base-moved" && cp "$base"/* "$work/base-moved/"
# a model's export first where the LoRA case's adapter goes: the PEFT export replaces it
mkdir "$work/lora.peft" && cp "$base/model.safetensors" "$work/lora.peft/"
checks=""
for name in lora rslora dora; do
    # shellcheck disable=SC2046 # the case's --set words
    step "$name.train" "$SHLM" train "$work/job.ini" --set "log.run_dir=$work/$name.run" \
        --set "checkpoint.dir=$work/$name.ck" $(keys $name) || continue
    # shellcheck disable=SC2046
    step "$name.eval" "$SHLM" eval "$work/job.ini" --ckpt "$work/$name.ck" \
        --set "log.run_dir=$work/$name.erun" $(keys $name) || continue
    eval "loss_$name=\$(eval_loss \"\$work/\$name.eval.log\")"
    step "$name.export" "$SHLM" ckpt export "$work/$name.ck" "$work/$name.peft" || continue
    merged_args=""
    [ $name = dora ] && merged_args="--base $work/base-moved"
    [ $name = lora ] && merged_dir=$work/lora.peft.merged || merged_dir=$work/$name.merged
    if [ $name = lora ]; then
        # the merged model goes where a PEFT export was: the adapter's files must go
        cp -R "$work/lora.peft" "$merged_dir"
    fi
    # shellcheck disable=SC2086 # --base DIR: two words
    step "$name.merged" "$SHLM" ckpt export --merged "$work/$name.ck" "$merged_dir" $merged_args ||
        continue
    checks="$checks $name:$work/$name.peft:$merged_dir"
    # 2. the adapter read back by shardlm
    step "$name.init_from" "$SHLM" eval "$work/job.ini" --set "lora.init_from=$work/$name.peft" \
        --set "log.run_dir=$work/$name.irun" || continue
    l=$(eval_loss "$work/$name.init_from.log")
    eval "L=\$loss_$name"
    if within "$l" "$L" 1e-6; then
        echo "$test_name: ok: $name: eval with lora.init_from = the exported adapter: $l, the checkpoint's $L"
    else
        fail "$name: eval with lora.init_from = the exported adapter: '$l', the checkpoint's $L"
    fi
done

# ---- what the directories hold ----
grep -q "removed $work/lora.peft/model.safetensors (the weights of an earlier model export" \
    "$work/lora.export.log" || fail "the PEFT export did not remove the model's weights beside it"
for f in adapter_config.json adapter_model.safetensors; do
    grep -q "removed $work/lora.peft.merged/$f (an earlier PEFT adapter export's" \
        "$work/lora.merged.log" && [ ! -e "$work/lora.peft.merged/$f" ] ||
        fail "the merged export left $f of the PEFT export beside it"
done
"$SHLM_PY" - "$work" "$base" >"$work/config.log" 2>&1 <<'EOF' || { cat "$work/config.log"; fail "adapter_config.json"; }
import json, sys
work, base = sys.argv[1:3]
want = {"lora": dict(r=4, lora_alpha=16, lora_dropout=0.05, use_rslora=False, use_dora=False,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                     "up_proj", "down_proj"]),
        "rslora": dict(r=4, lora_alpha=8, lora_dropout=0, use_rslora=True, use_dora=False,
                       target_modules=["q_proj", "v_proj"]),
        "dora": dict(r=4, lora_alpha=8, lora_dropout=0, use_rslora=False, use_dora=True,
                     target_modules=["q_proj", "k_proj", "o_proj", "down_proj"])}
for name, w in want.items():
    c = json.load(open(f"{work}/{name}.peft/adapter_config.json"))
    w.update(peft_type="LORA", task_type="CAUSAL_LM", base_model_name_or_path=base)
    bad = {k: c.get(k) for k, v in w.items()
           if (sorted(c.get(k) or []) != sorted(v) if k == "target_modules" else c.get(k) != v)}
    if bad:
        sys.exit(f"{name}: adapter_config.json has {bad}, want {dict((k, w[k]) for k in bad)}")
print("ok")
EOF
[ -s "$work/config.log" ] && grep -q '^ok$' "$work/config.log" &&
    echo "$test_name: ok: adapter_config.json of each: r, lora_alpha, lora_dropout, target_modules, use_rslora, use_dora, the base's path"

# ---- 1 and 3: PEFT and transformers ----
echo "+ $SHLM_PY $SHLM_SRCDIR/tests/lora_export.py check $base $work/val.bin $T$checks"
# shellcheck disable=SC2086 # the cases, one word each
py check "$base" "$work/val.bin" $T $checks >"$work/check.log" 2>&1 </dev/null ||
    { tail -n 15 "$work/check.log"; fail "the PEFT/transformers side failed"; }
for name in lora rslora dora; do
    eval "L=\${loss_$name:-}"
    for form in peft merged; do
        ref=$(sed -n "s/^loss $name $form //p" "$work/check.log")
        if [ -n "$L" ] && within "$ref" "$L" 1e-4; then
            echo "$test_name: ok: $name: $form export's loss in transformers $ref, shardlm's eval of the checkpoint $L"
        else
            fail "$name: $form export's loss in transformers '$ref', shardlm's eval of the checkpoint '$L' (tolerance 1e-4)"
        fi
    done
    set -- $(sed -n "s/^merge $name //p" "$work/check.log") x
    d=$1 tensor=${2:-}
    set -- $(sed -n "s/^moved $name //p" "$work/check.log") x
    if [ "$d" != x ] && awk -v d="$d" -v m="$1" 'BEGIN { exit !(d <= 1e-6 && m > 1e-4) }'; then
        echo "$test_name: ok: $name: the merged tensors equal PEFT's merge_and_unload within $d of each tensor's largest value (at most $tensor); the merge moved the weights by up to $1"
    else
        fail "$name: the merged tensors differ from PEFT's merge_and_unload by $d ($tensor) (the merge moved the weights by up to $1)"
    fi
    k=$(sed -n "s/^keys $name //p" "$work/check.log")
    [ "$k" = ok ] && echo "$test_name: ok: $name: the adapter's tensors are PEFT's own (names, shapes, F32)" ||
        fail "$name: the adapter's tensors: ${k:-not checked}"
done

# ---- 2 ranks write the same files ----
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
if step dora.peft2 sh "$mpi" 2 "$SHLM" ckpt export "$work/dora.ck" "$work/dora.peft2" &&
    step dora.merged2 sh "$mpi" 2 "$SHLM" ckpt export --merged "$work/dora.ck" "$work/dora.merged2" \
        --base "$work/base-moved"; then
    if cmp "$work/dora.peft/adapter_model.safetensors" "$work/dora.peft2/adapter_model.safetensors" &&
        cmp "$work/dora.merged/model.safetensors" "$work/dora.merged2/model.safetensors"; then
        echo "$test_name: ok: dora: the adapter and the merged model exported on 2 ranks equal 1 rank's byte for byte"
    else
        fail "dora: the exports on 2 ranks differ from 1 rank's"
    fi
fi

# ---- bad input: one line each ----
# refused NAME RC PATTERN... -- CMD...: CMD exits RC (1: bad input, 2: bad usage) with one
# error line naming each PATTERN
refused() {
    rf_name=$1 rf_rc=$2
    shift 2
    run_expecting_error "$@"
    if [ "$rc" -ne "$rf_rc" ] || [ -n "$why" ]; then
        fail "$rf_name: exit $rc (want $rf_rc) $why: $(head -c 600 "$work/err")"
    else
        echo "$test_name: ok: $rf_name: $(cat "$work/err")"
    fi
}
refused other_base 1 "$work/other: this base has fingerprint" "$work/lora.ck/step_3.h5 was trained on the base $base, fingerprint" \
    -- "$SHLM" ckpt export --merged "$work/lora.ck" "$work/other.merged" --base "$work/other"
[ -e "$work/other.merged" ] && fail "other_base: the refused merge created its output"
touch "$work/afile"
refused into_file 1 "$work/afile" "not a directory" -- "$SHLM" ckpt export "$work/lora.ck" "$work/afile"
refused peft_dtype 1 "--dtype: a LoRA checkpoint exports as a PEFT adapter" \
    -- "$SHLM" ckpt export "$work/lora.ck" "$work/bf16" --dtype bf16
refused base_alone 2 "--base DIR goes with --merged" \
    -- "$SHLM" ckpt export "$work/lora.ck" "$work/x" --base "$base"
find_h5py
if [ -n "$h5py" ]; then
    cp "$work/lora.ck/step_3.h5" "$work/v5.h5"
    "$h5py" "$SHLM_SRCDIR/tests/corrupt.py" v5 "$work/v5.h5" || fail "cannot make a format-5 file"
    refused format5 1 "$work/v5.h5 holds LoRA adapters but not lora.alpha (a format-5 file" \
        -- "$SHLM" ckpt export "$work/v5.h5" "$work/v5.peft"
else
    skip_part "format5: no python3 with h5py and numpy (Debian: python3-h5py)"
fi

test_end
