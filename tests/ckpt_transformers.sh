#!/bin/sh
# An exported shardlm checkpoint loads in Hugging Face transformers and reproduces
# shardlm's logits (tests/golden/check_export.py). The checkpoint is the golden fixture
# imported through model.init_from and trained 3 steps on 2 ranks (so its weights are
# shardlm's own, not the fixture's); it is exported in fp32 (tolerance 1e-4) and bf16
# (5e-2: the weights are rounded), and shardlm's logits come from `generate
# --dump-logits`. Skipped (77) when no python3 here has torch, transformers and
# safetensors, or there is no MPI launcher.
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/ckpt_transformers.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
. "$here/pyenv.sh"
. "$here/lib.sh"
shlm_python torch transformers safetensors >/dev/null ||
    skip_test "$(shlm_python torch transformers safetensors)"
py=$SHLM_PY
work=$(mktemp -d "${TMPDIR:-/tmp}/shlm-ckpt-tf.XXXXXX") || exit 99
fails=0
run() {
    echo "+ $*"
    "$@" >"$work/last.log" 2>&1 </dev/null
    rc=$?
    skip_without_launcher $rc
    if [ $rc -ne 0 ]; then
        tail -n 15 "$work/last.log"
        echo "ckpt_transformers: FAIL: exit $rc"
        fails=$((fails + 1))
    fi
    return $rc
}
mkdir -p "$work/hf"
cat >"$work/hf/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
 "intermediate_size": 44, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "vocab_size": 67, "max_position_embeddings": 64,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
# the fixture's model tensors alone (its golden.* tensors are no parameters of the model)
"$py" -c 'import sys; from safetensors.numpy import load_file, save_file
save_file({k: v for k, v in load_file(sys.argv[1]).items() if not k.startswith("golden.")}, sys.argv[2])' \
    "$SHLM_SRCDIR/tests/golden/tiny_llama_golden.safetensors" "$work/hf/model.safetensors" || exit 1
"$SHLM" data random --vocab 67 --tokens 20000 "$work/r.bin" >/dev/null || exit 1
cat >"$work/g.ini" <<EOF2
[model]
dim = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 44
vocab_size = 67
max_seq_len = 64
init_from = $work/hf
[train]
seq_len = 16
micro_batch = 2
steps = 3
lr = 1e-2
[data]
train = $work/r.bin
[log]
run_dir = $work/run
[checkpoint]
dir = $work/ck
[runtime]
backend = cpu
threads = 1
EOF2
run sh "$mpi" 2 "$SHLM" train "$work/g.ini" && grep -h "imported\|saved" "$work/last.log"
run "$SHLM" ckpt export "$work/ck" "$work/exp32"
run "$SHLM" ckpt export "$work/ck" "$work/exp16" --dtype bf16
run sh "$mpi" 2 "$SHLM" generate "$work/g.ini" --ckpt "$work/ck" \
    --prompt-ids 0,5,66,12,7,7,30,1,64,2,9,33,18,40,3,11 --tokens 0 \
    --dump-logits "$work/logits.safetensors"
echo "+ $py $SHLM_SRCDIR/tests/golden/check_export.py $work/exp32 $work/logits.safetensors"
"$py" "$SHLM_SRCDIR/tests/golden/check_export.py" "$work/exp32" "$work/logits.safetensors" ||
    fails=$((fails + 1))
echo "+ $py $SHLM_SRCDIR/tests/golden/check_export.py $work/exp16 $work/logits.safetensors 5e-2"
"$py" "$SHLM_SRCDIR/tests/golden/check_export.py" "$work/exp16" "$work/logits.safetensors" 5e-2 ||
    fails=$((fails + 1))
if [ $fails -ne 0 ]; then
    echo "ckpt_transformers: FAIL; work directory kept: $work"
    exit 1
fi
rm -rf "$work"
echo "ckpt_transformers: PASS"
