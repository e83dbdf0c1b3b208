#!/bin/sh
# Prompt-response eval loss against transformers: a random Llama written by transformers
# (untied, fp32) is shardlm's model.init_from, the bundled validation pairs are prepared as
# bytes (responses trained, several documents per window of 64), and `shardlm eval` over
# them must print transformers' loss with labels -100 on the positions the token file
# masks (tests/sft_eval_ref.py, which reads the ids and the mask from the file), to 1e-4
# relative; the same on 2 ranks. Skipped (77) without torch and transformers
# (tests/pyenv.sh) or an MPI launcher.
#   SHLM=./shardlm SHLM_SRCDIR=. sh tests/sft_eval_ref.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
. "$SHLM_SRCDIR/tests/pyenv.sh"
. "$SHLM_SRCDIR/tests/lib.sh"
shlm_python torch transformers safetensors >/dev/null ||
    skip_test "$(shlm_python torch transformers safetensors)"
test_begin sft_eval_ref shlm-sft-eval
ref="$SHLM_PY $SHLM_SRCDIR/tests/sft_eval_ref.py"
echo "+ $ref make $work/hf"
$ref make "$work/hf" >"$work/make.log" 2>&1 || { cat "$work/make.log"; fail "could not make the model"; test_end; }
echo "+ $SHLM data prepare --tokenizer bytes --format prompt-response $SHLM_SRCDIR/examples/smollm2/data/prompt-response-val.jsonl $work/val.bin"
"$SHLM" data prepare --tokenizer bytes --format prompt-response \
    "$SHLM_SRCDIR/examples/smollm2/data/prompt-response-val.jsonl" "$work/val.bin" >/dev/null ||
    { fail "data prepare"; test_end; }
cat >"$work/eval.ini" <<EOF
[model]
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 96
vocab_size = 256
max_seq_len = 128
init_from = $work/hf
[train]
seq_len = 64
micro_batch = 2
steps = 1
[data]
train = $work/val.bin
val = $work/val.bin
shuffle = false
[runtime]
backend = cpu
threads = 1
EOF
# the windows eval covers: every whole window of the file, each scored once, whatever the
# world size (a rank with no window left in the last batch scores nothing)
count=$(python3 "$SHLM_SRCDIR/tests/sft_data.py" read "$work/val.bin" | $SHLM_PY -c \
    'import json, sys; print(json.load(sys.stdin)["header"]["count"])')
windows=$(((count - 1) / 64))
for np in 1 2; do
    echo "+ $ref loss $work/hf $work/val.bin 64 $windows"
    want=$($ref loss "$work/hf" "$work/val.bin" 64 "$windows" 2>"$work/ref.err") ||
        { cat "$work/ref.err"; fail "the reference failed"; continue; }
    echo "+ sh $SHLM_SRCDIR/tests/mpi_test.sh $np $SHLM eval $work/eval.ini"
    sh "$SHLM_SRCDIR/tests/mpi_test.sh" "$np" "$SHLM" eval "$work/eval.ini" >"$work/eval.log" 2>&1
    rc=$?
    skip_without_launcher $rc
    got=$(sed -n 's/^eval: .*, mean loss \([0-9.]*\) nats.*/\1/p' "$work/eval.log")
    scored=$(sed -n 's/^eval: .*: \([0-9]*\) tokens scored.*/\1/p' "$work/eval.log")
    echo "sft_eval_ref: $np rank(s), $windows windows: shardlm $got over $scored tokens, transformers ${want% *} over ${want#* } trained targets"
    [ "$scored" = "${want#* }" ] || fail "$np rank(s): shardlm scored $scored tokens, transformers ${want#* }"
    # within 1e-4 relative of the reference (both print 6 decimals)
    awk -v a="$got" -v b="${want% *}" 'BEGIN { d = a - b; if (d < 0) d = -d
        exit !(a != "" && d <= 1e-4 * b) }' ||
        { tail -5 "$work/eval.log"; fail "$np rank(s): eval loss $got, transformers ${want% *}"; }
done
test_end
