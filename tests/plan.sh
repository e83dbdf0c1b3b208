#!/bin/sh
# `shardlm plan` against the paper arithmetic and against what `shardlm train` really
# allocates and sends: (a) llama2-7b's sharded state is 16 P / S; (b) what each rank of
# small runs allocated, per category as the cpu backend's allocator counts it, equals
# plan's rows exactly (and the run's own plan check says so on every rank, and nothing is
# allocated after set-up), and the per-step comm line is within 1% of plan's, for every
# strategy, 2 to 4 ranks, bf16 parameters and reductions, accumulation and tied
# embeddings; (c) activation checkpointing none > selective > full, each equal to plan's
# row, with identical losses; (c') the FP8 recipes' operand buffers, exactly; (d)
# llama2-70b on 1024 ranks plans in under 2 s; (a', a'', b) LoRA and QLoRA: llama2-7b's
# adapters and frozen base (bf16, NF4), and the small model's allocations and comm with LoRA,
# DoRA and NF4 bases; (e) plan's own
# errors; (f) the verdict and the changes it offers; (g) llama2-7b on the cpu backend of a
# machine it does not fit: plan says so and train refuses before allocating; (h) the
# Llama-3.x presets' parameter counts and README.md's figures of them.
#   env SHLM=./shardlm SHLM_SRCDIR=. sh tests/plan.sh
set -u
: "${SHLM:?set SHLM to the shardlm binary}" "${SHLM_SRCDIR:?set SHLM_SRCDIR to the source tree}"
. "$SHLM_SRCDIR/tests/lib.sh"

T=$(mktemp -d "${TMPDIR:-/tmp}/shlm-plan.XXXXXX") || exit 99
# SHLM_KEEP_TMP=1 keeps the job and token files, so a printed command can be rerun
trap '[ -n "${SHLM_KEEP_TMP:-}" ] || rm -rf "$T"' EXIT
trap 'exit 130' INT TERM
limit=${SHLM_TEST_TIMEOUT:-60}
wrap=""
command -v timeout >/dev/null 2>&1 && wrap="timeout -k 5 $limit"
n_fail=0
n_ok=0
fail() { echo "FAIL: $*"; n_fail=$((n_fail + 1)); }
ok() { echo "ok: $*"; n_ok=$((n_ok + 1)); }

# run CMD...: one command (under timeout), stdout to $T/out, stderr to $T/err, sets $rc
run() {
    echo "+ $*"
    # shellcheck disable=SC2086
    $wrap "$@" >"$T/out" 2>"$T/err" </dev/null
    rc=$?
}
# row KEY: the bytes column of plan's row KEY in $T/out
row() { awk -v k="$1" '$1 == k { print $2; exit }' "$T/out"; }
# field KEY FILE: N from "KEY=N" in FILE
field() { sed -n "s/.*[ :]$1=\([0-9][0-9]*\).*/\1/p" "$2" | head -n 1; }
# near A B: |A - B| <= 1% of B (both non-negative integers; 0 only matches 0)
near() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") exit 1
        d = a - b; if (d < 0) d = -d; exit !(d <= 0.01 * b) }'
}
# check NAME MEASURED PLANNED: within 1%
check() {
    if near "$2" "$3"; then
        ok "$1: $2 vs $3"
    else
        fail "$1: $2, expected $3 (within 1%)"
    fi
}
now_ms() {
    t=$(date +%s%N 2>/dev/null)
    case $t in *[!0-9]* | '') echo $(($(date +%s) * 1000)) ;; *) echo $((t / 1000000)) ;; esac
}

# ---- (a) llama2-7b on 16 ranks: 16 P / S with S = 16 is P bytes per rank ----
P7=6738415616
run "$SHLM" plan "$SHLM_SRCDIR/jobs/llama2-7b.ini" --ranks 16
cat "$T/out"
if [ $rc -ne 0 ]; then
    cat "$T/err"
    fail "plan llama2-7b --ranks 16 exited $rc"
else
    p=$(sed -n 's/.*16 P \/ S with P = \([0-9]*\), S = \([0-9]*\).*/\1 \2/p' "$T/out")
    if [ "$p" = "$P7 16" ]; then ok "llama2-7b: P = $P7, S = 16"; else
        fail "llama2-7b: the 16P/S row says 'P S' = '$p', expected '$P7 16'"
    fi
    check "llama2-7b FULL_SHARD on 16 ranks: sharded_state_bytes ~ 16 P / 16" \
        "$(row sharded_state_bytes)" $((16 * P7 / 16))
    s=$(row sharded_state_bytes)
    m=$(row master_bytes) g=$(row grad_bytes) o=$(row moments_bytes)
    if [ -n "$s" ] && [ -n "$m" ] && [ $((m + g + o)) -eq "$s" ]; then
        ok "llama2-7b: master + grad + moments = sharded_state_bytes"
    else
        fail "llama2-7b: master $m + grad $g + moments $o != sharded_state_bytes $s"
    fi
fi

# ---- (a') llama2-7b LoRA (rank 16, all seven projections) on 16 ranks: the adapters'
# 39976960 parameters (32 layers x 16 x (4 x (4096 + 4096) + 3 x (4096 + 11008))) carry
# the fp32 state, the base its bf16 shard ----
A7=39976960
run "$SHLM" plan "$SHLM_SRCDIR/jobs/llama2-7b.ini" --ranks 16 --set lora.rank=16 \
    --set lora.targets=all --set fsdp.param_dtype=bf16
if [ $rc -ne 0 ]; then
    cat "$T/err"
    fail "plan llama2-7b LoRA --ranks 16 exited $rc"
else
    check "llama2-7b LoRA: master_bytes ~ 4 x adapters / 16" "$(row master_bytes)" $((4 * A7 / 16))
    check "llama2-7b LoRA: moments_bytes ~ 8 x adapters / 16" "$(row moments_bytes)" $((8 * A7 / 16))
    check "llama2-7b LoRA: frozen_bytes ~ 2 P / 16 (bf16)" "$(row frozen_bytes)" $((2 * P7 / 16))
    s=$(row sharded_state_bytes)
    m=$(row master_bytes) g=$(row grad_bytes) o=$(row moments_bytes) f=$(row frozen_bytes)
    if [ -n "$s" ] && [ -n "$f" ] && [ $((m + g + o + f)) -eq "$s" ]; then
        ok "llama2-7b LoRA: master + grad + moments + frozen = sharded_state_bytes"
    else
        fail "llama2-7b LoRA: master $m + grad $g + moments $o + frozen $f != sharded_state_bytes $s"
    fi
fi

# ---- (a'') the same as QLoRA (lora.base_dtype = nf4, double quant): the seven
# projections (32 x (4 x 4096² + 3 x 4096 x 11008) values, 12352 quanta of 64 x 256 a
# block, 772 a rank) at 0.5 + 1/64 + 4/16384 bytes a value, the rest of the base (norms,
# embedding, head) in bf16 ----
PJ7=6476005376
run "$SHLM" plan "$SHLM_SRCDIR/jobs/llama2-7b.ini" --ranks 16 --set lora.rank=16 \
    --set lora.targets=all --set fsdp.param_dtype=bf16 --set lora.base_dtype=nf4
if [ $rc -ne 0 ]; then
    cat "$T/err"
    fail "plan llama2-7b QLoRA --ranks 16 exited $rc"
else
    check "llama2-7b QLoRA: frozen_bytes ~ (0.5159 PJ + 2 (P - PJ)) / 16" "$(row frozen_bytes)" \
        $(((PJ7 / 2 + PJ7 / 64 + PJ7 / 4096 + 2 * (P7 - PJ7)) / 16))
    check "llama2-7b QLoRA: master_bytes ~ 4 x adapters / 16 (as LoRA's)" "$(row master_bytes)" \
        $((4 * A7 / 16))
fi

# ---- the small model, trained for 2 steps on the bundled corpus ----
run "$SHLM" data prepare --tokenizer bytes "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt" \
    "$T/train.bin"
if [ $rc -ne 0 ]; then
    cat "$T/err"
    echo "FAIL: cannot prepare the corpus"
    exit 1
fi
cp "$SHLM_SRCDIR/tests/jobs/small.ini" "$T/small.ini"

# train_vs_plan NAME NP ARGS...: trains small.ini on NP ranks with ARGS (--set ...), plans
# the same job for NP ranks, and compares the start-up memory line and the comm line
# with plan's rows. Leaves the train output in $T/NAME.train, plan's in $T/NAME.plan.
train_vs_plan() {
    name=$1 np=$2
    shift 2
    SHLM_TEST_TIMEOUT=$limit sh "$SHLM_SRCDIR/tests/mpi_test.sh" "$np" "$SHLM" train \
        "$T/small.ini" --set log.run_dir="$T/run.$name" "$@" >"$T/$name.train" 2>&1 </dev/null
    rc=$?
    grep -e '^+ ' -e '^memory per rank' -e '^comm per step' "$T/$name.train"
    skip_without_launcher $rc
    if [ $rc -ne 0 ]; then
        tail -n 20 "$T/$name.train"
        fail "$name: training on $np ranks exited $rc"
        return 1
    fi
    run "$SHLM" plan "$T/small.ini" --ranks "$np" "$@"
    cp "$T/out" "$T/$name.plan"
    grep -e '_bytes' "$T/out"
    if [ $rc -ne 0 ]; then
        cat "$T/err"
        fail "$name: plan --ranks $np exited $rc"
        return 1
    fi
    mem="$T/$name.train"
    grep '^memory per rank by category (allocated):' "$mem" >"$T/$name.bycat"
    for key in master_bytes grad_bytes moments_bytes frozen_bytes gathered_bytes \
        grad_buffer_bytes activation_bytes; do
        got=$(field $key "$T/$name.bycat") want=$(row $key)
        if [ -n "$got" ] && [ "$got" = "$want" ]; then
            ok "$name: $key allocated $got = plan"
        else
            fail "$name: $key allocated '$got', plan says '$want' (exactly)"
        fi
    done
    if grep -q '^plan check: allocated == plan (the backend' "$mem" && ! grep -q '^plan check: rank' "$mem"; then
        ok "$name: every rank's own plan check: allocated == plan"
    else
        fail "$name: the run's plan check: $(grep '^plan check' "$mem" | tr '\n' ' ')"
    fi
    if grep -q '^plan check after the steps: 0 bytes allocated after set-up' "$mem"; then
        ok "$name: nothing allocated after set-up"
    else
        fail "$name: $(grep '^plan check after' "$mem" || echo 'no plan check after the steps')"
    fi
    check "$name: comm shard_group_bytes" "$(field shard_group_bytes "$mem")" \
        "$(row shard_group_bytes)"
    check "$name: comm replica_group_bytes" "$(field replica_group_bytes "$mem")" \
        "$(row replica_group_bytes)"
    return 0
}

# ---- (b) measured vs planned ----
train_vs_plan full2 2
train_vs_plan full4 4
# LoRA: the frozen base's bf16 shards beside the adapters' state, DoRA's magnitudes
train_vs_plan lora2 2 --set lora.rank=4 --set lora.targets=all --set fsdp.param_dtype=bf16
train_vs_plan lora4_sgo_dora 4 --set fsdp.strategy=SHARD_GRAD_OP --set lora.rank=2 \
    --set lora.dora=true --set "lora.targets=q v down"
# QLoRA: the NF4 blocks (double quant, then plain with bf16 rest) and the gathers' staging
train_vs_plan qlora2 2 --set lora.rank=4 --set lora.targets=all --set lora.base_dtype=nf4
train_vs_plan qlora4_sgo_plain 4 --set fsdp.strategy=SHARD_GRAD_OP --set lora.rank=2 \
    --set lora.base_dtype=nf4 --set lora.double_quant=false --set fsdp.param_dtype=bf16
s2=$(field sharded_state_bytes "$T/full2.train")
s4=$(field sharded_state_bytes "$T/full4.train")
if [ -n "$s2" ] && [ -n "$s4" ]; then
    check "FULL_SHARD: sharded_state_bytes halves from 2 to 4 ranks" "$s4" $((s2 / 2))
else
    fail "FULL_SHARD: no sharded_state_bytes in the 2- or 4-rank start-up output"
fi
train_vs_plan sgo3 3 --set fsdp.strategy=SHARD_GRAD_OP --set train.global_batch=3
train_vs_plan noshard2_bf16 2 --set fsdp.strategy=NO_SHARD --set fsdp.param_dtype=bf16 \
    --set fsdp.reduce_dtype=bf16
train_vs_plan full2_bf16reduce 2 --set fsdp.reduce_dtype=bf16 --set fsdp.param_dtype=bf16
train_vs_plan one_rank 1
# two micro-batches per step: the shard-group traffic is per step, not per micro-batch
train_vs_plan full4accum 4 --set train.global_batch=8
train_vs_plan hybrid4 4 --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2
train_vs_plan hybrid4accum 4 --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2 \
    --set train.global_batch=8
if grep -q 'shard group 2 x replica group 2' "$T/hybrid4.plan" &&
    [ "$(row replica_group_bytes)" -gt 0 ] 2>/dev/null; then
    ok "HYBRID_SHARD on 4 ranks, 2 per node: shard group 2 x replica group 2, replica traffic"
else
    fail "HYBRID_SHARD on 4 ranks, 2 per node: expected shard group 2 x replica group 2 and" \
        "non-zero replica_group_bytes"
fi

# tied embeddings: unit 0 (embedding and output projection) is gathered again for the head
# and reduced twice per micro-batch (SHARD_GRAD_OP keeps it gathered)
tie="--set model.tie_word_embeddings=true"
# shellcheck disable=SC2086 # one --set, two words
train_vs_plan tied_full4accum 4 $tie --set train.global_batch=8
# shellcheck disable=SC2086
train_vs_plan tied_hybrid4accum 4 $tie --set fsdp.strategy=HYBRID_SHARD \
    --set runtime.ranks_per_node=2 --set train.global_batch=8
# shellcheck disable=SC2086
train_vs_plan tied_sgo2accum 2 $tie --set fsdp.strategy=SHARD_GRAD_OP --set train.global_batch=4
if [ -n "$(field sharded_state_bytes "$T/tied_full4accum.train")" ] &&
    [ "$(field sharded_state_bytes "$T/tied_full4accum.train")" -lt \
        "$(field sharded_state_bytes "$T/full4accum.train")" ]; then
    ok "tied embeddings: less sharded state than the untied model (no lm_head.weight)"
else
    fail "tied embeddings: sharded_state_bytes not below the untied model's"
fi

# ---- (c) activation checkpointing: less memory, the same losses ----
for ac in none selective full; do
    train_vs_plan "ac_$ac" 2 --set fsdp.activation_checkpointing="$ac"
done
a_none=$(field activation_bytes "$T/ac_none.train")
a_sel=$(field activation_bytes "$T/ac_selective.train")
a_full=$(field activation_bytes "$T/ac_full.train")
if [ -n "$a_none" ] && [ -n "$a_sel" ] && [ -n "$a_full" ] &&
    [ "$a_none" -gt "$a_sel" ] && [ "$a_sel" -gt "$a_full" ]; then
    ok "activation_bytes none $a_none > selective $a_sel > full $a_full"
else
    fail "activation_bytes: none '$a_none', selective '$a_sel', full '$a_full':" \
        "expected none > selective > full"
fi
losses() { sed -n 's/.*"step": *\([0-9]*\),.*"loss": *\([^,]*\),.*/\1 \2/p' "$1"; }
ref=$(losses "$T/run.ac_none/metrics.jsonl" 2>/dev/null)
echo "losses (none): $(echo "$ref" | tr '\n' ' ')"
if [ "$(echo "$ref" | grep -c .)" -ne 2 ]; then
    fail "activation checkpointing none: expected 2 steps in metrics.jsonl, got '$ref'"
else
    for ac in selective full; do
        got=$(losses "$T/run.ac_$ac/metrics.jsonl" 2>/dev/null)
        if [ "$got" = "$ref" ]; then
            ok "activation checkpointing $ac: losses identical to none"
        else
            fail "activation checkpointing $ac: losses '$(echo "$got" | tr '\n' ' ')'" \
                "differ from none's"
        fi
    done
fi

# ---- (c') FP8 recipes: their buffers are counted exactly. small.ini: N = 32 tokens, d 64,
# qkv (4 + 2·2)·16 = 128, att 64, F 96, 2 layers, fp32 act (4 bytes). The three operand
# buffers: the a side N x the widest input or output (2F = 192) codes and max(N, 192)
# scales, the b side the largest weight (gate|up, 192 x 64 = 12288) or N x the widest
# input (F = 96) codes and 192 scales, the t side (q(dyᵀ)) 192 x N codes and 192 scales:
# 6144 + 768 + 12288 + 768 + 6144 + 768 = 26880 bytes. Selective checkpointing keeps what
# bf16 keeps: + 26880. No checkpointing: each layer keeps q(ln1ᵀ), q(ln2ᵀ), q(hᵀ) (codes
# 64·32, 64·32, 96·32 and 64, 64, 96 scales: 8064 bytes) instead of ln1, ln2, h
# (32·(64 + 64 + 96)·4 = 28672), which become one scratch set:
# 26880 + 2·8064 - 2·28672 + 28672 = 14336 bytes more than bf16; tensorwise adds the one
# float where the norms and SwiGLU leave their output's amax: 14340 ----
train_vs_plan fp8_tensorwise2 2 --set train.matmul=fp8-tensorwise
train_vs_plan fp8_rowwise_sgo2 2 --set train.matmul=fp8-rowwise --set fsdp.strategy=SHARD_GRAD_OP
train_vs_plan fp8_rowwise_selective2 2 --set train.matmul=fp8-rowwise \
    --set fsdp.activation_checkpointing=selective
a_fp8=$(field activation_bytes "$T/fp8_tensorwise2.train")
a_fp8_sel=$(field activation_bytes "$T/fp8_rowwise_selective2.train")
if [ -n "$a_fp8" ] && [ -n "$a_none" ] && [ $((a_fp8 - a_none)) -eq 14340 ] &&
    [ -n "$a_fp8_sel" ] && [ $((a_fp8_sel - a_sel)) -eq 26880 ]; then
    ok "FP8 activation_bytes = bf16's + 14340 (tensorwise, none), + 26880 (rowwise, selective)"
else
    fail "FP8 activation_bytes '$a_fp8' / '$a_fp8_sel', bf16 '$a_none' / '$a_sel': expected" \
        "bf16's + 14340 / + 26880"
fi
# fsdp.fp8_all_gather (fp8-tensorwise, one rank, bf16 parameters: the gather slots exist):
# each of the 2 slots gains a code buffer of a block unit's bytes (64 + 128·64 + 64·64 + 64
# + 192·64 + 64·96 = 30848) and the engine an amax (4 bytes) and a scale_inv (16 bytes:
# cuBLASLt's alignment) per FP8 matrix (4 a block, 2 blocks): 2·30848 + 8·(4 + 16) = 61856
# bytes more, counted exactly; the losses are those of quantizing the bf16 weights in each
# product
train_vs_plan fp8_weights1 1 --set train.matmul=fp8-tensorwise --set fsdp.param_dtype=bf16
train_vs_plan fp8_no_weights1 1 --set train.matmul=fp8-tensorwise --set fsdp.param_dtype=bf16 \
    --set fsdp.fp8_all_gather=false
g_on=$(field gathered_bytes "$T/fp8_weights1.train")
g_off=$(field gathered_bytes "$T/fp8_no_weights1.train")
if [ -n "$g_on" ] && [ -n "$g_off" ] && [ $((g_on - g_off)) -eq 61856 ]; then
    ok "fsdp.fp8_all_gather: gathered_bytes $g_on = $g_off without it + 61856"
else
    fail "fsdp.fp8_all_gather: gathered_bytes '$g_on', without it '$g_off': expected + 61856"
fi
l_on=$(losses "$T/run.fp8_weights1/metrics.jsonl" 2>/dev/null)
l_off=$(losses "$T/run.fp8_no_weights1/metrics.jsonl" 2>/dev/null)
if [ -n "$l_on" ] && [ "$l_on" = "$l_off" ]; then
    ok "fsdp.fp8_all_gather: losses identical to quantizing in each product"
else
    fail "fsdp.fp8_all_gather: losses '$(echo "$l_on" | tr '\n' ' ')' differ from" \
        "'$(echo "$l_off" | tr '\n' ' ')'"
fi
# llama2-7b at seq 4096 (bf16 act): the kept transposes save more than the buffers cost
run "$SHLM" plan "$SHLM_SRCDIR/jobs/llama2-7b.ini" --ranks 8 --backend cuda
a7_bf16=$(row activation_bytes)
run "$SHLM" plan "$SHLM_SRCDIR/jobs/llama2-7b.ini" --ranks 8 --backend cuda --set train.matmul=fp8-rowwise
a7_fp8=$(row activation_bytes)
if [ -n "$a7_bf16" ] && [ -n "$a7_fp8" ] && [ "$a7_fp8" -lt "$a7_bf16" ]; then
    ok "llama2-7b: FP8 activation_bytes $a7_fp8 < bf16's $a7_bf16"
else
    fail "llama2-7b: FP8 activation_bytes '$a7_fp8' not below bf16's '$a7_bf16'"
fi

# ---- (d) llama2-70b on 1024 ranks, 8 per node, plans fast; the job's global batch (64)
# is below 1024 ranks x micro_batch 1, so the run sets one that fits ----
for strategy in FULL_SHARD HYBRID_SHARD; do
    t0=$(now_ms)
    run "$SHLM" plan "$SHLM_SRCDIR/jobs/llama2-70b.ini" --ranks 1024 --ranks-per-node 8 \
        --set train.global_batch=1024 --set fsdp.strategy=$strategy
    ms=$(($(now_ms) - t0))
    cat "$T/out" "$T/err"
    total=$(row total_bytes)
    if [ $rc -ne 0 ] || [ -z "$total" ] || [ "$total" -le 0 ] 2>/dev/null; then
        fail "llama2-70b $strategy on 1024 ranks: exit $rc, total_bytes '$total'"
    elif [ $ms -ge 2000 ]; then
        fail "llama2-70b $strategy on 1024 ranks: took $ms ms, expected under 2 s"
    else
        ok "llama2-70b $strategy on 1024 ranks (8 per node): total_bytes $total in $ms ms"
    fi
done
if grep -q 'shard group 8 x replica group 128' "$T/out"; then
    ok "llama2-70b HYBRID_SHARD: shard group 8 x replica group 128"
else
    fail "llama2-70b HYBRID_SHARD with 8 ranks per node: expected shard group 8 x replica group 128"
fi

# ---- (f) the verdict: llama2-7b at micro-batch 4 on one H200 does not fit; each change
# plan says would fit does fit when planned with it, at the size it said ----
sed -e 's/^micro_batch = 1$/micro_batch = 4/' -e 's/^global_batch = 1024$/global_batch = 8/' \
    "$SHLM_SRCDIR/jobs/llama2-7b.ini" >"$T/7b.ini"
printf '[fsdp]\nparam_dtype = bf16\n' >>"$T/7b.ini"
run "$SHLM" plan "$T/7b.ini" --ranks 1 --backend cuda --device h200
cat "$T/out" "$T/err" | sed -n '/^verdict/,$p'
need=$(awk '$1 == "total_bytes" { printf "%.2f", $2 / 1073741824 }' "$T/out")
if [ $rc -ne 0 ] || ! grep -q "^verdict: does not fit h200 (143771 MiB): needs $need GiB per rank" "$T/out"; then
    fail "llama2-7b micro-batch 4 on one h200: no 'does not fit' verdict for total_bytes $need GiB"
else
    ok "llama2-7b micro-batch 4 on one h200: does not fit, $need GiB"
fi
knobs=$(sed -n 's/^  would fit with \(.*\): \([0-9.]*\) GiB.*/\1|\2/p' "$T/out")
[ -n "$knobs" ] || fail "llama2-7b micro-batch 4 on one h200: no change offered"
while IFS='|' read -r knob gib; do
    # shellcheck disable=SC2086
    run "$SHLM" plan "$T/7b.ini" --ranks 1 --backend cuda --device h200 $knob
    if grep -q "^verdict: fits h200 (143771 MiB): $gib of " "$T/out"; then
        ok "with $knob: fits, $gib GiB as promised"
    else
        fail "with $knob: plan promised $gib GiB and a fit, got: $(grep '^verdict' "$T/out")"
    fi
done <<KNOBS
$knobs
KNOBS
run "$SHLM" plan "$T/7b.ini" --ranks 1 --backend cuda --device-gib 1000
grep -q "^verdict: fits a device of 1000 GiB" "$T/out" && ok "--device-gib 1000: fits" ||
    fail "--device-gib 1000: $(grep '^verdict' "$T/out")"

# ---- (g) llama2-7b on the cpu backend where it does not fit: plan says so, and train
# refuses before allocating (the host's available memory shared by the node's ranks),
# with one line of the bytes needed and free, in seconds. Under a limit of 8 GiB of
# address space, so that a run that does allocate fails at once instead of taking the
# machine's memory ----
run "$SHLM" plan "$SHLM_SRCDIR/jobs/llama2-7b.ini" --ranks 1 --backend cpu
need=$(awk '$1 == "total_bytes" { printf "%.2f", $2 / 1073741824 }' "$T/out")
if grep -q "^verdict: fits this machine's available memory" "$T/out"; then
    echo "SKIP: (g) llama2-7b ($need GiB) fits this machine's memory: no refusal to check"
elif ! grep -q "^verdict: does not fit this machine's available memory: .* shared by 1 rank: needs $need GiB" "$T/out"; then
    fail "(g) plan llama2-7b --backend cpu: no 'does not fit this machine's available memory' verdict for $need GiB: $(grep '^verdict' "$T/out")"
else
    ok "(g) plan llama2-7b --backend cpu: $(grep '^verdict' "$T/out")"
    rss="" # GNU time's maximum resident set size, kB, where it is installed
    timing=""
    [ -x /usr/bin/time ] && /usr/bin/time -f %M true >/dev/null 2>&1 && timing="/usr/bin/time -o $T/rss -f %M"
    t0=$(now_ms)
    # shellcheck disable=SC2086 # timing's words
    run sh -c "ulimit -v 8388608; exec $timing \"\$@\"" sh "$SHLM" train \
        "$SHLM_SRCDIR/jobs/llama2-7b.ini" --set "data.train=$T/train.bin" \
        --set runtime.backend=cpu --set "log.run_dir=$T/run.7b"
    ms=$(($(now_ms) - t0))
    [ -n "$timing" ] && rss=$(tail -n 1 "$T/rss")
    grep '^shardlm: error' "$T/err" | sed 's/^/    /'
    if [ $rc -eq 0 ] || [ $rc -ge 124 ] || [ "$(grep -c '^shardlm: error: ' "$T/err")" -ne 1 ] ||
        ! grep -q "^shardlm: error: .*llama2-7b.ini: the job needs $need GiB per rank (sharded state" "$T/err" ||
        ! grep -q "GiB are free per rank (this machine's available memory: .* shared by 1 rank)" "$T/err"; then
        fail "(g) train llama2-7b on the cpu backend: exit $rc, want one line of the $need GiB needed and the memory free"
    elif [ $ms -gt 10000 ]; then
        fail "(g) train llama2-7b on the cpu backend: refused after $ms ms, want a few seconds"
    elif [ -n "$rss" ] && [ "$rss" -gt 1048576 ]; then
        fail "(g) train llama2-7b on the cpu backend: refused, but its resident set reached $rss kB"
    else
        ok "(g) train llama2-7b on the cpu backend: refused after $ms ms${rss:+, at most $rss kB resident}"
    fi
fi

# ---- (e) plan's errors: one line, non-zero exit ----
# expect_error NAME PATTERN...
expect_error() {
    name=$1
    shift
    sed 's/^/    stderr: /' "$T/err"
    lines=$(wc -l <"$T/err" | tr -d ' ')
    if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then
        fail "$name: exit status $rc, expected a non-zero status below 124"
        return
    fi
    if [ "$lines" -ne 1 ] || ! grep -q '^shardlm: error: ' "$T/err"; then
        fail "$name: expected exactly one 'shardlm: error: ...' line on stderr, got $lines"
        return
    fi
    for p in "$@"; do
        if ! grep -q -F -e "$p" "$T/err"; then
            fail "$name: error line does not name '$p'"
            return
        fi
    done
    ok "$name (exit $rc)"
}
run "$SHLM" plan "$T/small.ini"
expect_error "plan without --ranks" "--ranks"
run "$SHLM" plan "$T/small.ini" --ranks 3 --ranks-per-node 2
expect_error "plan --ranks 3 --ranks-per-node 2" small.ini ranks_per_node "world size 3"
run "$SHLM" plan "$T/small.ini" --ranks 3 --set runtime.ranks_per_node=2
expect_error "plan --ranks 3 --set runtime.ranks_per_node=2" small.ini ranks_per_node
run "$SHLM" plan "$T/small.ini" --ranks 0
expect_error "plan --ranks 0" "--ranks: '0' is out of range, must be in [1, 16777216]"
run "$SHLM" plan "$T/small.ini" --ranks 2 --device z900
expect_error "plan --device z900" "--device z900" "not in the device table" h200
run "$SHLM" plan "$T/small.ini" --ranks 2 --device-gib -1
expect_error "plan --device-gib -1" "--device-gib" "-1"

# ---- (h) the Llama-3.x presets: their parameter counts are the published checkpoints'
# (the element counts of Meta's Llama-3.1-8B, 3.1-70B, 3.2-1B and 3.2-3B safetensors), and
# README.md's table of them is what plan prints for the command it gives (no GPU visible:
# the ops' scratch, sized on a GPU, is not in the total) ----
for c in llama3.2-1b:1235814400:8 llama3.2-3b:3212749824:8 llama3-8b:8030261248:8 \
    llama3-70b:70553706496:64; do
    preset=${c%%:*} rest=${c#*:}
    want=${rest%%:*} ranks=${rest#*:}
    extra=""
    [ "$preset" = llama3-70b ] && extra="--set fsdp.activation_checkpointing=selective"
    # shellcheck disable=SC2086
    run env CUDA_VISIBLE_DEVICES= "$SHLM" plan "$SHLM_SRCDIR/jobs/llama2-7b.ini" --ranks "$ranks" --ranks-per-node 8 \
        --backend cuda --device h200 --set "model.preset=$preset" --set train.seq_len=8192 \
        --set fsdp.param_dtype=bf16 $extra
    if [ $rc -ne 0 ]; then
        cat "$T/err"
        fail "plan $preset exited $rc"
        continue
    fi
    got=$(sed -n "s/^# model $preset: \([0-9]*\) parameters.*/\1/p" "$T/out")
    if [ "$got" = "$want" ]; then ok "$preset: $got parameters"; else
        fail "$preset: plan says '$got' parameters, the published checkpoint has $want"
    fi
    total=$(awk '$1 == "total_bytes" { print $3; exit }' "$T/out")
    readme=$(awk -F'|' -v p="\`$preset\`" '$2 == " " p " " { gsub(/ |GiB/, "", $8); print $8 }' \
        "$SHLM_SRCDIR/README.md")
    if [ -n "$total" ] && [ "$readme" = "$total" ]; then
        ok "$preset: README.md's total per rank is plan's, $total GiB"
    else
        fail "$preset: README.md's total per rank '$readme' GiB, plan's '$total' GiB"
    fi
done

echo "plan: $n_ok passed, $n_fail failed"
[ $n_fail -eq 0 ]
