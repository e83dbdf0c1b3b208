#!/bin/sh
# README.md's "Fine-tune a Hugging Face model" block, run as written, at a few steps: the
# block between its marker and the closing fence, with the cached SmolLM2 directory in
# place of get-model.sh's download (tests/smollm2_model.sh tests that script), this build's
# shardlm and the MPI launcher wrapper, short texts for train.txt and val.txt, and the job
# cut to 2 steps of 1 x 32 tokens and generate to 8 tokens (its context kept at 64, which
# the chat prompt fits: generate refuses a prompt longer than its context). Then: eval scored the trained
# checkpoint, generate answered, and the export holds the weights, config.json and the
# tokenizer. Skipped (77) without the model directory ($SHLM_SMOLLM2, tests/pyenv.sh) or
# an MPI launcher.
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/readme_finetune.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
case $SHLM in /*) ;; *) SHLM="$(pwd)/$SHLM" ;; esac
. "$SHLM_SRCDIR/tests/pyenv.sh"
. "$SHLM_SRCDIR/tests/lib.sh"
[ -f "$SHLM_SMOLLM2/model.safetensors" ] ||
    skip_test "no $SHLM_SMOLLM2 (examples/smollm2/get-model.sh makes it)"
test_begin readme_finetune shlm-readme
mpi="$(cd "$SHLM_SRCDIR" && pwd)/tests/mpi_test.sh"
block=$(sed -n '/^<!-- tests\/readme_finetune.sh runs this block -->$/,/^```$/p' "$SHLM_SRCDIR/README.md" |
    sed '1,2d;$d')
[ -n "$block" ] || { fail "no block after the marker in README.md"; exit 1; }
printf '%s\n' "$block" | sed \
    -e "s|^examples/smollm2/get-model.sh models/smollm2\$|mkdir -p models \&\& ln -s '$SHLM_SMOLLM2' models/smollm2|" \
    -e "s|^mpirun -np \([0-9]*\) ./shardlm|sh '$mpi' \1 '$SHLM'|" -e "s|^./shardlm|'$SHLM'|" \
    -e 's/^seq_len = .*/seq_len = 32/' -e 's/^micro_batch = .*/micro_batch = 1/' \
    -e 's/^steps = .*/steps = 2/' -e 's/^warmup_steps = .*/warmup_steps = 1/' \
    -e '/ generate /s/$/ --tokens 8 --set train.seq_len=64/' >"$work/block.sh"
cat "$work/block.sh"
head -c 4000 "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt" >"$work/train.txt"
head -c 1500 "$SHLM_SRCDIR/jobs/data/shakespeare-val.txt" >"$work/val.txt"
(cd "$work" && sh -e -x ./block.sh) >"$work/block.log" 2>&1 </dev/null
rc=$?
skip_without_launcher $rc
if [ $rc -ne 0 ]; then
    tail -n 20 "$work/block.log"
    fail "the README block exited $rc"
fi
grep -q "^eval: val.bin: [0-9]* tokens scored .*weights: .*ckpt-smollm2/step_2.h5" "$work/block.log" ||
    fail "eval did not score the trained checkpoint: $(grep '^eval:' "$work/block.log")"
grep -q "^generate: [0-9]* tokens" "$work/block.log" || fail "generate printed no reply"
for f in model.safetensors config.json generation_config.json tokenizer.json tokenizer_config.json; do
    [ -s "$work/smollm2-finetuned/$f" ] || fail "the export has no $f"
done
grep -E '^(eval|generate|export):' "$work/block.log"
sed -n '/^<|im_start|>assistant/,/^---$/p' "$work/block.log" | sed 's/^/    /'
if [ "$fails" -ne 0 ]; then
    echo "readme_finetune: FAIL ($fails); work directory kept: $work"
    exit 1
fi
rm -rf "$work"
echo "readme_finetune: PASS ($(($(date +%s) - t_start)) s)"
