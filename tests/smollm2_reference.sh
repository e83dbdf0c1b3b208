#!/bin/sh
# SmolLM2-135M-Instruct (examples/smollm2/get-model.sh) through shardlm and through Hugging
# Face transformers (fp32, CPU; tests/smollm2_reference.py), with a job that has no [model]
# keys (model.init_from gives the architecture, data.tokenizer defaults to its tokenizer):
#  1. eval's loss on a text (one window: the whole file) equals transformers' loss on the
#     same ids to 1e-4 relative;
#  2. generate --chat --temperature 0 (through the KV cache): the ChatML prompt's ids equal
#     apply_chat_template's and the 128 greedy tokens equal transformers' generate, token for
#     token;
#  3. 2 training steps on 2 ranks (FULL_SHARD, tied embeddings), saved, exported: transformers
#     loads the export with lm_head tied to the embedding, and its loss on the text equals
#     shardlm's eval of the checkpoint to 1e-4 (and differs from the source's: the export is
#     the trained model); the export holds the source's tokenizer files, and its tokenizer
#     encodes every line of the corpus and some edge cases like the source's (HF tokenizers
#     and AutoTokenizer), with the same special ids and chat template.
# Skipped (77) without a python3 that has torch, transformers and tokenizers, without the
# model directory ($SHLM_SMOLLM2, tests/pyenv.sh), or without an MPI launcher. Minutes on 2
# cores (two model loads in python, two evals, a generate, two steps of 135M parameters).
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/smollm2_reference.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
. "$SHLM_SRCDIR/tests/pyenv.sh"
. "$SHLM_SRCDIR/tests/lib.sh"
shlm_python torch transformers tokenizers numpy >/dev/null ||
    skip_test "$(shlm_python torch transformers tokenizers numpy)"
model=$SHLM_SMOLLM2
[ -f "$model/config.json" ] && [ -f "$model/model.safetensors" ] ||
    skip_test "no $model (examples/smollm2/get-model.sh $model makes it)"
test_begin smollm2_reference shlm-smollm2-ref
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1
prompt="Write a short story about a robot who learns to paint."
n_new=128

# field NAME KEY: the words after "KEY" on the line of $work/NAME.log that starts with it
field() { sed -n "s/^$2 //p" "$work/$1.log" | head -n 1; }
# rel A B: |A - B| / |B|
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; printf "%.3e", d / b }'; }
# eval_loss NAME: the mean loss of `shardlm eval`'s line in $work/NAME.log
eval_loss() { sed -n 's/^eval: .* mean loss \([0-9.]*\) nats.*/\1/p' "$work/$1.log"; }

head -c 3000 "$SHLM_SRCDIR/jobs/data/shakespeare-val.txt" >"$work/text.txt"
step prepare "$SHLM" data prepare --tokenizer "$model" "$work/text.txt" "$work/text.bin" || exit 1
cat >"$work/ref.ini" <<JOB
# no [model] keys: SmolLM2's config.json gives the architecture, its directory the tokenizer
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

step eval_source "$SHLM" eval "$work/ref.ini"
# one thread: a decode step is hundreds of small parallel regions, each of which a shared
# machine's scheduler can stretch by a time slice when a rank's threads are not all running
step generate "$SHLM" generate "$work/ref.ini" --chat --prompt "$prompt" --tokens $n_new \
    --temperature 0 --ids --set runtime.threads=1
step train sh "$mpi" 2 "$SHLM" train "$work/ref.ini" --set train.seq_len=64 --set train.steps=2 \
    --set train.lr=1e-4 --set train.warmup_steps=0 --set "checkpoint.dir=$work/ck"
step export "$SHLM" ckpt export "$work/ck" "$work/exp" && grep '^export:' "$work/export.log"
step eval_ckpt "$SHLM" eval "$work/ref.ini" --ckpt "$work/ck"
step reference "$SHLM_PY" "$SHLM_SRCDIR/tests/smollm2_reference.py" "$model" "$work/exp" \
    "$work/text.bin" "$prompt" $n_new "$SHLM_SRCDIR/jobs/data/shakespeare-val.txt" &&
    cat "$work/reference.log"

# ---- 1. eval against transformers ----
set -- $(field reference loss_source)
n_ref=${1:-} l_ref=${2:-}
l_src=$(eval_loss eval_source)
scored=$(sed -n 's/^eval: .*: \([0-9]*\) tokens scored.*/\1/p' "$work/eval_source.log")
if [ -z "$l_ref" ] || [ -z "$l_src" ]; then
    fail "no loss from shardlm ('$l_src') or transformers ('$l_ref')"
else
    d=$(rel "$l_src" "$l_ref")
    if [ "$scored" != "$n_ref" ] || awk -v d="$d" 'BEGIN { exit !(d > 1e-4) }'; then
        fail "eval: shardlm $l_src over $scored tokens, transformers $l_ref over $n_ref: rel $d"
    else
        echo "smollm2_reference: ok: eval loss $l_src over $scored tokens, transformers $l_ref: rel diff $d"
    fi
fi

# ---- 2. greedy generation against transformers ----
p_ours=$(field generate "prompt ids:")
g_ours=$(field generate "generated ids:")
p_ref=$(field reference prompt_ids)
g_ref=$(field reference generated_ids)
if [ -z "$p_ref" ] || [ "$p_ours" != "$p_ref" ]; then
    fail "the chat prompt's ids differ: shardlm '$p_ours', transformers '$p_ref'"
elif ! grep -q '^generate: KV cache: 1 rows of ' "$work/generate.log"; then
    fail "generate did not run through the KV cache: $(grep '^generate: ' "$work/generate.log" | head -n 1)"
elif [ "$(echo "$g_ref" | wc -w)" -ne $n_new ] || [ "$g_ours" != "$g_ref" ]; then
    fail "greedy generation differs: shardlm '$g_ours', transformers '$g_ref'"
else
    echo "smollm2_reference: ok: ChatML prompt of $(echo "$p_ours" | wc -w) ids and $n_new greedy tokens equal transformers'"
    sed -n '/^<|im_start|>assistant/,/^---$/p' "$work/generate.log" | sed 's/^/    /'
fi

# ---- 3. the export ----
set -- $(field reference loss_export)
l_exp_ref=${2:-}
l_ck=$(eval_loss eval_ckpt)
if [ -z "$l_exp_ref" ] || [ -z "$l_ck" ]; then
    fail "no loss of the export (transformers '$l_exp_ref') or of the checkpoint ('$l_ck')"
else
    d=$(rel "$l_ck" "$l_exp_ref")
    moved=$(rel "$l_ck" "$l_src")
    if awk -v d="$d" 'BEGIN { exit !(d > 1e-4) }'; then
        fail "export: transformers' loss $l_exp_ref, shardlm's of the checkpoint $l_ck: rel $d"
    elif awk -v d="$moved" 'BEGIN { exit !(d < 1e-5) }'; then
        fail "the trained checkpoint's loss $l_ck is the source's $l_src: did training change it?"
    else
        echo "smollm2_reference: ok: export reloaded by transformers: loss $l_exp_ref, shardlm's" \
            "eval of the checkpoint $l_ck: rel diff $d (source $l_src)"
    fi
fi
[ "$(field reference export_tied)" = True ] || fail "transformers does not load the export tied"
for f in tokenizer.json tokenizer_config.json generation_config.json; do
    cmp -s "$model/$f" "$work/exp/$f" || fail "the export's $f is not the source's"
done
set -- $(field reference tokenizer_lines)
if [ $# -ne 3 ] || [ "$2" != "$1" ] || [ "$3" != "$1" ]; then
    fail "the export's tokenizer encodes unlike the source's: lines, same (tokenizers), same (AutoTokenizer): $*"
else
    echo "smollm2_reference: ok: the export's tokenizer encodes all $1 lines like the source's"
fi
case $(field reference tokenizer_ids) in
*" same") echo "smollm2_reference: ok: the export's bos/eos/pad ids and chat template are the source's" ;;
*) fail "the export's special ids or chat template differ: $(field reference tokenizer_ids)" ;;
esac

if [ "$fails" -ne 0 ]; then
    echo "smollm2_reference: FAIL ($fails); work directory kept: $work"
    exit 1
fi
rm -rf "$work"
echo "smollm2_reference: PASS ($(($(date +%s) - t_start)) s)"
