#!/bin/sh
# data.doc_mask through the whole model on a GPU: a model trained on the Shakespeare bytes
# (cuda backend, head_dim 64 so the Hopper attention kernels run) is evaluated on the
# validation text cut into one document per line, packed, with document masks on and off,
# on the cuda backend (the Hopper kernels and the mma.sync fallback) and on the cpu
# backend (fp32, whose attention is tested against an explicit mask). Each cuda loss must
# equal the cpu loss of the same setting within 1e-3 relative (bf16 activations, fp32
# weights; an H200 gives 2e-5 to 3.2e-5), and the masks must matter: on and off at least
# 2.5 times that apart on the cpu (3.9e-3 on this data)
# (each line losing the lines before it as context), so a cuda pass that ignored them
# would fail.
# Usage: SHLM=./shardlm SHLM_SRCDIR=. sh tests/gpu/doc_mask.sh   (exit 77: no GPU)
set -u
SHLM=${SHLM:-./shardlm}
SRC=${SHLM_SRCDIR:-.}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge 1 ] || { echo "doc_mask: no GPU visible: skipped"; exit 77; }
T=$(mktemp -d)
"$SHLM" data prepare --tokenizer bytes "$SRC/jobs/data/shakespeare-train.txt" "$T/train.bin" >/dev/null || exit 1
# one JSON text record per non-empty line, the newline kept
python3 -c 'import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    if line.strip(): print(json.dumps({"text": line}))' "$SRC/jobs/data/shakespeare-val.txt" >"$T/val.jsonl" || exit 1
"$SHLM" data prepare --tokenizer bytes --format jsonl-text "$T/val.jsonl" "$T/val.bin" || exit 1
shape="--set model.dim=256 --set model.n_layers=4 --set model.n_heads=4 --set model.n_kv_heads=2
  --set model.ffn_dim=688 --set train.seq_len=128 --set train.micro_batch=4 --set train.global_batch=16
  --set train.sample_tokens=0 --set train.eval_batches=0 --set data.val=$T/val.bin
  --set log.run_dir=$T/run --set data.train=$T/train.bin"
echo "+ $SHLM train $SRC/jobs/tiny.ini $shape --set runtime.backend=cuda --set fsdp.param_dtype=bf16 --set train.steps=300 --set checkpoint.dir=$T/ck"
# shellcheck disable=SC2086
"$SHLM" train "$SRC/jobs/tiny.ini" $shape --set runtime.backend=cuda --set fsdp.param_dtype=bf16 \
    --set train.steps=300 --set train.eval_every=0 --set checkpoint.dir="$T/ck" >"$T/train.log" 2>&1 ||
    { tail -20 "$T/train.log"; exit 1; }
loss() { # backend doc_mask cuda.attention: the eval loss of the checkpoint on val.bin
    # shellcheck disable=SC2086
    "$SHLM" eval "$SRC/jobs/tiny.ini" $shape --set train.steps=300 \
        --set runtime.backend="$1" --set data.doc_mask="$2" --set checkpoint.dir="$T/ck" \
        --set fsdp.param_dtype=fp32 --set cuda.attention="$3" \
        2>"$T/eval.err" | sed -n 's/^eval: .*, mean loss \([0-9.]*\) nats.*/\1/p'
}
fails=0
for dm in false true; do
    cpu=$(loss cpu $dm sm90)
    for kind in sm90 mma_sync; do
        cuda=$(loss cuda $dm $kind)
        v=$(awk -v a="$cuda" -v b="$cpu" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d
            if (a == "" || b == "") { print "FAIL (no loss)"; exit }
            printf "%.2e %s", d, (d <= 1e-3) ? "PASS" : "FAIL" }')
        case $v in *PASS) ;; *) fails=$((fails + 1)); cat "$T/eval.err" ;; esac
        echo "doc_mask $dm: cuda ($kind) $cuda, cpu $cpu: rel diff $v"
    done
    eval "cpu_$dm=\$cpu"
done
v=$(awk -v on="$cpu_true" -v off="$cpu_false" 'BEGIN { d = (on - off) / off; if (d < 0) d = -d
    if (on == "" || off == "") { print "FAIL (no loss)"; exit }
    printf "%.2e %s", d, (d >= 2.5e-3) ? "PASS" : "FAIL" }')
case $v in *PASS) ;; *) fails=$((fails + 1)) ;; esac
echo "doc_mask on against off (cpu): $cpu_true vs $cpu_false, rel diff $v (the masks matter)"
echo "doc_mask: $fails failure(s)"
[ "$fails" -eq 0 ] || exit 1
rm -rf "$T"
