#!/bin/sh
# The shard plan against the device: a one-GPU training run's device memory in use grows,
# from before the arena to after its steps (cudaMemGetInfo), by the plan's total within 1%
# -- the arena (sharded state, buffers, activations, each rounded as the allocator rounds
# it), the ops' scratch (attention's backward dS at T = 1024) and the matmul library's
# workspace -- and nothing is allocated outside the arena. Runs FULL_SHARD with bf16
# parameters and SHARD_GRAD_OP with selective checkpointing, a 0.5B-parameter model.
# Usage: SHLM=./shardlm SHLM_SRCDIR=. sh tests/gpu/plan_memory.sh   (exit 77: no GPU)
set -u
SHLM=${SHLM:-./shardlm}
SRC=${SHLM_SRCDIR:-.}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge 1 ] || { echo "plan_memory: no GPU visible: skipped"; exit 77; }
T=$(mktemp -d)
"$SHLM" data prepare --tokenizer bytes "$SRC/jobs/data/shakespeare-train.txt" "$T/train.bin" >/dev/null || exit 1
common="--set data.train=$T/train.bin --set data.val= --set model.dim=2048
  --set model.n_layers=8 --set model.n_heads=16 --set model.n_kv_heads=8 --set model.ffn_dim=5632
  --set model.vocab_size=32000 --set model.max_seq_len=1024 --set train.seq_len=1024
  --set train.micro_batch=2 --set train.global_batch=2 --set train.steps=3
  --set train.warmup_steps=1 --set train.sample_tokens=0 --set train.eval_every=0
  --set log.every=1 --set runtime.backend=cuda"
fails=0
check() { # name extra...
    name=$1; shift
    echo "+ $SHLM train $SRC/jobs/tiny.ini $common $* --set log.run_dir=$T/$name"
    # shellcheck disable=SC2086
    "$SHLM" train "$SRC/jobs/tiny.ini" $common "$@" --set log.run_dir="$T/$name" \
        > "$T/$name.log" 2>&1 || { tail -20 "$T/$name.log"; fails=$((fails + 1)); return; }
    grep -e '^memory per rank' -e '^plan check' -e 'ms/step' "$T/$name.log"
    line=$(grep '^plan check on the device' "$T/$name.log")
    pct=$(echo "$line" | sed -n 's/.*: \([-+][0-9.]*\)%$/\1/p')
    v=$(awk -v p="$pct" 'BEGIN { if (p == "") exit 1; if (p < 0) p = -p; print (p <= 1.0) ? "PASS" : "FAIL" }') || v=FAIL
    if grep -q 'arena of .* full' "$T/$name.log"; then
        echo "$name: allocated outside the arena: $(grep 'arena of' "$T/$name.log")"; v=FAIL
    fi
    echo "$name: memory in use grew by the plan's total within 1%: $v"
    [ "$v" = PASS ] || fails=$((fails + 1))
}
check full_bf16 --set fsdp.strategy=FULL_SHARD --set fsdp.param_dtype=bf16
check sgo_selective --set fsdp.strategy=SHARD_GRAD_OP --set fsdp.activation_checkpointing=selective
echo "plan_memory: $fails failure(s)"
[ "$fails" -eq 0 ] || exit 1
rm -rf "$T"
