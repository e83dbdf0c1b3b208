#!/bin/sh
# Tied embeddings (model.tie_word_embeddings: one tensor for the lookup and the output
# projection) stay tied through training, checkpoint, resume, resharding and export:
#  1. 40 steps straight (A) and 20 + save + resume to 40 (B, C) on 2 ranks FULL_SHARD give
#     identical losses and gradient norms of steps 21-40 and identical step-40 state
#     (every dataset's checksum, 60 of them: no lm_head.weight);
#  2. the checkpoint says tied (ckpt info, the attribute model.tie_word_embeddings = 1
#     through h5py where it is installed, whose reader also recomputes every checksum);
#  3. its step-20 checkpoint resumes on 4 ranks HYBRID_SHARD 2 x 2 within 1e-5 of A;
#  4. an untied job refuses it with one line naming tie_word_embeddings;
#  5. `ckpt export` writes no lm_head.weight and a config.json that says tied; with torch
#     and transformers in the venv, LlamaForCausalLM loads it with lm_head sharing the
#     embedding's storage and reproduces shardlm's logits (tests/golden/check_export.py).
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/tied_embeddings.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher; or the h5py part of 2 or the transformers
# part of 5 could not run, the rest passing). The work directory is kept on failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"
. "$SHLM_SRCDIR/tests/lib.sh"
. "$SHLM_SRCDIR/tests/pyenv.sh"
test_begin tied_embeddings shlm-tied
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1
prepare_corpus "$work/train.bin"
tie="--set model.tie_word_embeddings=true"

# run NAME NP [--set ...]: trains the tied job into $work/NAME (log NAME.log, NAME.err)
run() {
    name=$1 np=$2
    shift 2
    echo "+ sh $mpi $np $SHLM train $job --set data.train=$work/train.bin --set log.run_dir=$work/$name $tie $*"
    # shellcheck disable=SC2086 # $tie: one --set, two words
    sh "$mpi" "$np" "$SHLM" train "$job" --set "data.train=$work/train.bin" \
        --set "log.run_dir=$work/$name" $tie "$@" >"$work/$name.log" 2>"$work/$name.err" </dev/null
    rc=$?
    skip_without_launcher $rc
    if [ $rc -ne 0 ]; then
        tail -n 8 "$work/$name.log" "$work/$name.err"
        fail "$name exited with $rc"
    fi
    return $rc
}
# steps FILE FIRST LAST KEY: "step value" lines of metrics.jsonl
steps() {
    sed -n "s/.*\"step\": \([0-9]*\),.*\"$4\": \([^,}]*\).*/\1 \2/p" "$1" |
        awk -v a="$2" -v b="$3" '$1 >= a && $1 <= b'
}

# ---- 1. exact resume ----
run A 2 --set "checkpoint.dir=$work/A/ck" || exit 1
run B 2 --set "checkpoint.dir=$work/B/ck" --set train.stop_after=20 || exit 1
run C 2 --set "checkpoint.dir=$work/B/ck" || exit 1
for key in loss grad_norm; do
    steps "$work/A/metrics.jsonl" 21 40 $key >"$work/A.$key"
    steps "$work/C/metrics.jsonl" 21 40 $key >"$work/C.$key"
    if [ "$(wc -l <"$work/A.$key")" -ne 20 ] || ! cmp -s "$work/A.$key" "$work/C.$key"; then
        diff "$work/A.$key" "$work/C.$key" | head -n 6
        fail "the $key of steps 21-40 differ after the resume"
    fi
done
"$SHLM" ckpt info "$work/A/ck" >"$work/A.info" 2>&1
"$SHLM" ckpt info "$work/B/ck" >"$work/C.info" 2>&1
grep ' 0x' "$work/A.info" >"$work/A.sums"
grep ' 0x' "$work/C.info" >"$work/C.sums"
if [ "$(wc -l <"$work/A.sums")" -ne 60 ] || ! cmp -s "$work/A.sums" "$work/C.sums"; then
    diff "$work/A.sums" "$work/C.sums" | head -n 6
    fail "the step-40 state differs after the resume (or not 60 datasets: $(wc -l <"$work/A.sums"))"
else
    echo "tied_embeddings: ok: steps 21-40 and the step-40 state (60 dataset checksums) identical after a resume"
fi

# ---- 2. the checkpoint says tied ----
grep -q "tie_word_embeddings" "$work/A.info" || fail "ckpt info does not say tie_word_embeddings"
grep -q "lm_head" "$work/A.info" && fail "the tied checkpoint holds an lm_head.weight"
find_h5py
if [ -n "$h5py" ]; then
    t=$("$h5py" -c 'import sys, h5py; print(int(h5py.File(sys.argv[1], "r").attrs["model.tie_word_embeddings"]))' \
        "$work/A/ck/step_40.h5")
    [ "$t" = 1 ] || fail "attribute model.tie_word_embeddings is '$t', not 1"
    "$h5py" "$SHLM_SRCDIR/tests/ckpt_h5py.py" "$work/A/ck/step_40.h5" >"$work/h5py.log" 2>&1 ||
        { cat "$work/h5py.log"; fail "ckpt_h5py.py rejects the tied checkpoint"; }
    tail -n 1 "$work/h5py.log"
else
    skip_part "2: the attribute read by an outside reader: no python3 with h5py and numpy (apt-get install python3-h5py)"
fi

# ---- 3. resharding: 2 ranks FULL_SHARD -> 4 ranks HYBRID_SHARD 2 x 2 ----
run R 4 --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2 \
    --set "checkpoint.resume=$work/B/ck/step_20.h5" --set train.stop_after=30
steps "$work/A/metrics.jsonl" 21 30 loss >"$work/A.loss30"
steps "$work/R/metrics.jsonl" 21 30 loss >"$work/R.loss30"
rel=$(awk 'FNR == NR { ref[$1] = $2; next }
    { n++; a = ref[$1] + 0; d = a - $2; if (d < 0) d = -d; if (a < 0) a = -a
      if (d / a > m) m = d / a }
    END { if (n != 10) print "missing"; else printf "%.3e\n", m }' "$work/A.loss30" "$work/R.loss30")
if [ "$rel" = missing ] || awk -v r="$rel" 'BEGIN { exit !(r > 1e-5) }'; then
    fail "resharded to 4 ranks HYBRID_SHARD: steps 21-30 differ from A by $rel"
else
    echo "tied_embeddings: ok: resharded to 4 ranks HYBRID_SHARD 2 x 2, steps 21-30 within $rel of A"
fi

# ---- 4. an untied job refuses the tied checkpoint ----
echo "+ $SHLM train $job --set data.train=$work/train.bin --set checkpoint.resume=$work/A/ck ..."
"$SHLM" train "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/untied" \
    --set "checkpoint.resume=$work/B/ck/step_20.h5" >"$work/untied.log" 2>"$work/untied.err" </dev/null
refused_before_step1 untied $? "tie_word_embeddings = true there, false in this job"

# ---- 5. export ----
echo "+ $SHLM ckpt export $work/A/ck $work/exp"
"$SHLM" ckpt export "$work/A/ck" "$work/exp" >"$work/export.log" 2>&1 ||
    { cat "$work/export.log"; fail "export failed"; }
names=$(python3 -c 'import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
print(" ".join(sorted(k for k in json.loads(raw[8:8 + n]) if k != "__metadata__")))' \
    "$work/exp/model.safetensors")
case " $names " in
*" lm_head.weight "*) fail "the export holds lm_head.weight" ;;
*" model.embed_tokens.weight "*) echo "tied_embeddings: ok: the export has model.embed_tokens.weight and no lm_head.weight" ;;
*) fail "the export has no model.embed_tokens.weight: $names" ;;
esac
tied=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["tie_word_embeddings"])' \
    "$work/exp/config.json")
[ "$tied" = True ] || fail "the export's config.json says tie_word_embeddings: $tied"
if shlm_python torch transformers safetensors >/dev/null; then
    "$SHLM" generate "$job" --set "data.train=$work/train.bin" $tie --ckpt "$work/A/ck" \
        --prompt "ROMEO:" --tokens 0 --dump-logits "$work/logits.safetensors" >"$work/gen.log" 2>&1 ||
        { cat "$work/gen.log"; fail "generate --dump-logits failed"; }
    share=$("$SHLM_PY" -c 'import sys, torch; from transformers import LlamaForCausalLM
m = LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
print(m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr())' "$work/exp" 2>/dev/null)
    [ "$share" = True ] || fail "transformers does not load lm_head tied to the embedding: '$share'"
    echo "+ $SHLM_PY $SHLM_SRCDIR/tests/golden/check_export.py $work/exp $work/logits.safetensors"
    "$SHLM_PY" "$SHLM_SRCDIR/tests/golden/check_export.py" "$work/exp" "$work/logits.safetensors" ||
        fail "transformers' logits of the tied export differ from shardlm's"
else
    skip_part "5: the export loaded by transformers: $(shlm_python torch transformers safetensors)"
fi

test_end
