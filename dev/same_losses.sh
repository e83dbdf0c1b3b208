#!/usr/bin/env bash
# Whether two shardlm binaries train the same: a fixed set of CPU runs (every strategy on 1
# and 4 ranks, accumulation, each activation-checkpointing mode, bf16 gathers and
# reductions, both FP8 recipes' emulation, tied embeddings, document masks, a validation
# pass) with each binary, and their metrics.jsonl compared on every step's loss, val_loss,
# grad_norm and lr, as text: equal means bit for bit. For a refactoring that must not
# change a number.
#   dev/same_losses.sh OLD_BINARY NEW_BINARY [WORKDIR]
# Run from the source tree (it uses tests/jobs/equiv.ini and jobs/data/).
set -euo pipefail
old=$(realpath "$1") new=$(realpath "$2") work=${3:-$(mktemp -d)}
mkdir -p "$work"
cd "$(dirname "$0")/.."
train=jobs/data/shakespeare-train.bin val=jobs/data/shakespeare-val.bin
for s in train val; do
    [ -f jobs/data/shakespeare-$s.bin ] ||
        "$new" data prepare --tokenizer bytes jobs/data/shakespeare-$s.txt jobs/data/shakespeare-$s.bin >/dev/null
done
flags=()
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
[ "$(nproc)" -lt 4 ] && flags+=(--oversubscribe)
common=(--set train.steps=8 --set train.micro_batch=2 --set data.train="$PWD/$train" --set data.val="$PWD/$val"
        --set train.eval_every=4 --set train.eval_batches=2 --set checkpoint.dir=)
runs=(
  "1 base"
  "4 fullshard-accum --set train.global_batch=16 --set fsdp.strategy=FULL_SHARD"
  "4 hybrid --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2"
  "4 gradop --set fsdp.strategy=SHARD_GRAD_OP"
  "4 noshard --set fsdp.strategy=NO_SHARD"
  "2 full-ac --set fsdp.activation_checkpointing=full"
  "2 selective-ac --set fsdp.activation_checkpointing=selective"
  "2 bf16 --set fsdp.param_dtype=bf16 --set fsdp.reduce_dtype=bf16"
  "2 fp8-tensorwise --set train.matmul=fp8-tensorwise"
  "2 fp8-rowwise --set train.matmul=fp8-rowwise"
  "2 tied --set model.tie_word_embeddings=true"
  "2 docmask --set data.doc_mask=true"
)
fail=0
for r in "${runs[@]}"; do
    read -r np name rest <<<"$r"
    # shellcheck disable=SC2206
    extra=($rest)
    for which in old new; do
        bin=$old; [ $which = new ] && bin=$new
        dir=$work/$name.$which
        rm -rf "$dir"
        mpirun -np "$np" "${flags[@]}" "$bin" train tests/jobs/equiv.ini "${common[@]}" \
            --set log.run_dir="$dir" "${extra[@]}" >"$dir.log" 2>&1 || { echo "$name: $which failed (see $dir.log)"; fail=1; }
        python3 - "$dir/metrics.jsonl" >"$dir.losses" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["step"], *(repr(r.get(k)) for k in ("loss", "val_loss", "grad_norm", "lr")))
PY
    done
    if cmp -s "$work/$name.old.losses" "$work/$name.new.losses"; then
        echo "same: $name ($np ranks, $(wc -l <"$work/$name.new.losses") steps)"
    else
        echo "DIFFERENT: $name"; diff "$work/$name.old.losses" "$work/$name.new.losses" | head -5; fail=1
    fi
done
exit $fail
