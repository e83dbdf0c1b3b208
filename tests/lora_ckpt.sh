#!/bin/sh
# LoRA checkpoints: the adapters, their AdamW moments and the frozen base's identity, each
# rank writing its own slices.
#
# tests/jobs/equiv.ini with DoRA adapters of rank 4 on all seven projections, global batch
# 12, micro-batch 1 (accumulation at every rank count), 8 steps:
#  exact: A trains 8 steps on 4 ranks FULL_SHARD; B stops after step 4 and saves; C resumes
#  B's checkpoint on 4 ranks. C's losses and gradient norms of steps 5-8 must equal A's as
#  printed, and its step-8 checkpoint A's bit for bit (every dataset's checksum: the
#  adapters and both moments). The checkpoint holds the adapters only (no base tensor), and
#  `ckpt info` names its base.
#  generate: A's step-8 adapters sample through the KV cache on 1 and 2 ranks
#  exactly the tokens of --recompute (the window through the forward), which differ from
#  the base's.
#  other rank counts: B's step-4 checkpoint resumed on 1 rank and on 3 (HYBRID_SHARD is
#  not needed: every strategy loads by ranges) continues within 1e-6 (relative) of A's
#  losses (only the order of fp32 sums differs).
#  a changed base: resuming B's checkpoint with another train.seed (whose initialisation
#  is another base) is refused with one line naming both bases, before any step; so is a
#  resume with other [lora] keys (rank, targets, dora; alpha and rslora, which scale the
#  adapters).
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, MPIRUN), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/lora_ckpt.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/equiv.ini"
tol=1e-6

. "$SHLM_SRCDIR/tests/lib.sh"
test_begin lora_ckpt shlm-lora-ckpt

prepare_corpus "$work/train.bin"

# run NAME NP [--set k=v ...]: trains the job with DoRA adapters into $work/NAME
run() {
    name=$1
    np=$2
    shift 2
    train_on "$name" "$np" "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/$name" \
        --set train.steps=8 --set train.lr=1e-2 --set train.global_batch=12 \
        --set train.micro_batch=1 --set lora.rank=4 --set lora.targets=all --set lora.dora=true \
        "$@"
    rc=$?
    skip_without_launcher $rc
    if [ $rc -ne 0 ]; then
        tail -n 5 "$work/$name.log"
        fail "$name: exit $rc"
    fi
    return $rc
}

# ---- exact on 4 ranks ----
run A 4 --set "checkpoint.dir=$work/A/ck"
run B 4 --set "checkpoint.dir=$work/B/ck" --set train.stop_after=4
mkdir -p "$work/C" && cp -R "$work/B/ck" "$work/C/ck"
run C 4 --set "checkpoint.dir=$work/C/ck"
grep -q "loaded weights and optimizer of $work/C/ck/step_4.h5" "$work/C.log" ||
    fail "C did not resume from step_4.h5"
steps "$work/A/metrics.jsonl" loss | sed -n '5,8p' >"$work/A.tail"
steps "$work/C/metrics.jsonl" loss >"$work/C.tail"
steps "$work/A/metrics.jsonl" grad_norm | sed -n '5,8p' >>"$work/A.tail"
steps "$work/C/metrics.jsonl" grad_norm >>"$work/C.tail"
if [ "$(wc -l <"$work/C.tail")" -ne 8 ] || ! cmp -s "$work/A.tail" "$work/C.tail"; then
    diff "$work/A.tail" "$work/C.tail" | head -n 6
    fail "the resumed steps 5-8 differ from the uninterrupted run's"
else
    echo "$test_name: ok: steps 5-8 resumed on 4 ranks: loss and grad_norm identical"
fi
why=$(sums_problem "$work/A/ck" "$work/C/ck")
[ -z "$why" ] || fail "C's step-8 state: $why"
[ -n "$why" ] || echo "$test_name: ok: the step-8 adapters and moments identical to A's" \
    "($(wc -l <"$work/A-ck.sums") datasets)"
"$SHLM" ckpt info "$work/B/ck" >"$work/info.txt" 2>&1
if grep -q 'proj.weight ' "$work/info.txt" || ! grep -q 'lora_magnitude_vector' "$work/info.txt"; then
    fail "the checkpoint does not hold the adapters alone: $work/info.txt"
fi
grep -q "^  lora  .*rank 4 on q k v o gate up down (DoRA), alpha 8, dropout 0; frozen base initialised from train.seed = 1337" \
    "$work/info.txt" || fail "ckpt info does not name the adapters and their base: $(grep lora "$work/info.txt")"

# ---- generate: the KV cache applies the adapters as the forward does ----
# gen NAME NP ARGS...: the ids sampled (temperature 1, seed 11: every logit counts) from
# "ROMEO:" (prompt and reply inside the context of 32, so every token goes through the
# cache unless --recompute), a micro-batch of 1 so that 1 and 2 ranks divide the batch
gen() {
    name=$1
    np=$2
    shift 2
    set -- generate "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/$name" \
        --set train.global_batch=2 --set train.micro_batch=1 --prompt "ROMEO:" --tokens 20 \
        --temperature 1 --seed 11 --ids "$@"
    echo "+ sh $mpi $np $SHLM $*"
    sh "$mpi" "$np" "$SHLM" "$@" >"$work/$name.out" 2>&1 </dev/null ||
        fail "$name: exit $? ($(tail -n 1 "$work/$name.out"))"
    sed -n 's/^generated ids://p' "$work/$name.out" >"$work/$name.ids"
    [ -s "$work/$name.ids" ] || fail "$name: no generated ids in $work/$name.out"
}
lora_keys="--set lora.rank=4 --set lora.targets=all --set lora.dora=true"
gen gen_base 1
gen gen_rc 1 --ckpt "$work/A/ck" $lora_keys --recompute
gen gen_kv 1 --ckpt "$work/A/ck" $lora_keys
gen gen_kv2 2 --ckpt "$work/A/ck" $lora_keys
grep -q '^generate: KV cache' "$work/gen_kv.out" || fail "gen_kv: generate did not use the KV cache"
if cmp -s "$work/gen_base.ids" "$work/gen_rc.ids"; then
    fail "the trained adapters generate the base's tokens: the comparison below proves nothing"
elif ! cmp -s "$work/gen_kv.ids" "$work/gen_rc.ids" || ! cmp -s "$work/gen_kv2.ids" "$work/gen_rc.ids"; then
    fail "generate through the KV cache differs from --recompute with DoRA adapters:" \
        "$(cat "$work/gen_rc.ids") vs $(cat "$work/gen_kv.ids") (1 rank), $(cat "$work/gen_kv2.ids") (2 ranks)"
else
    echo "$test_name: ok: generate with A's adapters through the KV cache (1 and 2 ranks) equals" \
        "--recompute, sampled, and differs from the base's tokens"
fi

# ---- other rank counts ----
for np in 1 3; do
    mkdir -p "$work/R$np" && cp -R "$work/B/ck" "$work/R$np/ck"
    run "R$np" $np --set "checkpoint.dir=$work/R$np/ck" || continue
    steps "$work/A/metrics.jsonl" loss | sed -n '5,8p' >"$work/A.loss"
    steps "$work/R$np/metrics.jsonl" loss >"$work/R$np.loss"
    rel=$(rows_maxrel "$work/A.loss" "$work/R$np.loss" 4)
    if [ "$rel" = missing ] || awk -v r="$rel" -v t="$tol" 'BEGIN { exit !(r > t) }'; then
        fail "R$np: losses of steps 5-8 vs the 4-rank run: $rel (tolerance $tol)"
    else
        echo "$test_name: ok: 4 ranks -> $np: steps 5-8 within $rel of the uninterrupted run"
    fi
done

# ---- refused: another base, other adapters ----
bad() {
    name=$1
    pattern=$2
    shift 2
    mkdir -p "$work/$name" && cp -R "$work/B/ck" "$work/$name/ck"
    echo "+ $SHLM train $job ... --set checkpoint.dir=$work/$name/ck $*"
    "$SHLM" train "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/$name" \
        --set train.steps=8 --set train.global_batch=12 --set train.micro_batch=12 \
        --set lora.rank=4 --set lora.targets=all --set "checkpoint.dir=$work/$name/ck" "$@" \
        >"$work/$name.out" 2>"$work/$name.err" </dev/null
    refused_before_step1 "$name" $? "$pattern"
}
bad other_base "frozen base (initialised from train.seed = 1337" --set lora.dora=true \
    --set train.seed=7
grep -q "(initialised from train.seed = 7) is another" "$work/other_base.err" ||
    fail "other_base: the job's base is not named"
bad other_adapters "holds adapters of lora.rank = 4, targets = q k v o gate up down, dora = 1"
bad other_alpha "holds adapters trained with lora.alpha = 8, rslora = false; this job has lora.alpha = 16, rslora = false" \
    --set lora.dora=true --set lora.alpha=16
bad other_rslora "holds adapters trained with lora.alpha = 8, rslora = false; this job has lora.alpha = 8, rslora = true" \
    --set lora.dora=true --set lora.rslora=true

test_end
