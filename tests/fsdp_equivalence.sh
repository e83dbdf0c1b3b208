#!/bin/sh
# FSDP acceptance: every strategy on 2, 3 and 4 ranks reproduces the single-rank loss
# curve of tests/jobs/equiv.ini (one rank is the reference no sharding can change).
#
# 50 steps on one rank give the reference curve (metrics.jsonl, losses printed with
# %.9g); each run below must match it at every step within a relative tolerance:
# 1e-5 in fp32 (only the order of the sums differs), 2e-2 with bf16 parameters or
# reductions (and then it must differ by more than 1e-5, or bf16 was not in effect).
# In fp32 the gradient norm of every step must match within 1e-5 too (it sees the last
# step's gradients, which no loss does); in bf16 its difference is only printed.
# The runs cover FULL_SHARD, SHARD_GRAD_OP, NO_SHARD and HYBRID_SHARD (2 nodes x 1 rank
# at 2 ranks, 2 x 2 at 4, by runtime.ranks_per_node) at 2 and 4 ranks, each strategy
# with and without gradient accumulation (micro_batch 1 against micro_batch =
# global_batch / ranks), activation checkpointing none/full/selective each in at least
# three runs, prefetch off in one; plus FULL_SHARD on 3 ranks with model.vocab_size =
# 259, so that no unit and not the parameter count divide by 3 (the padding path),
# against its own 1-rank reference (global_batch 6, a multiple of 3). Tied embeddings
# (model.tie_word_embeddings = true: one tensor for the lookup and the output projection,
# whose gradient parts meet in one shard) against their own 1-rank reference, every
# strategy, within 1e-6 in fp32 (loss and gradient norm), plus one bf16 run.
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, MPIRUN), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/fsdp_equivalence.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). Each command is printed; the work
# directory (logs, metrics.jsonl of every run) is kept when the test fails.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/equiv.ini"
steps=50
tol_fp32=1e-5
tol_tied=1e-6
tol_bf16=2e-2

. "$SHLM_SRCDIR/tests/lib.sh"
test_begin fsdp_equivalence shlm-equiv

# ---- the data: the bundled corpus as bytes ----
prepare_corpus "$work/train.bin"

# run NAME NP [--set k=v ...]: trains the job into $work/NAME; returns the launcher's
# status (77: no launcher)
run() {
    name=$1
    np=$2
    shift 2
    echo "+ sh $mpi $np $SHLM train $job --set data.train=$work/train.bin" \
        "--set log.run_dir=$work/$name --set train.steps=$steps $*"
    sh "$mpi" "$np" "$SHLM" train "$job" --set "data.train=$work/train.bin" \
        --set "log.run_dir=$work/$name" --set "train.steps=$steps" "$@" \
        >"$work/$name.log" 2>&1 </dev/null
}

# topo NAME: "S R" of rank 0 from its topology line (shard=r/S replica=r/R)
topo() {
    sed -n 's/^rank 0\/[0-9]* .* shard=0\/\([0-9]*\) replica=0\/\([0-9]*\) .*/\1 \2/p' \
        "$work/$1.log" | head -n 1
}

# ---- the references: one rank ----
status=0
run ref 1 --set train.micro_batch=8 --set train.global_batch=8
rc=$?
skip_without_launcher $rc
run ref3 1 --set model.vocab_size=259 --set train.micro_batch=6 --set train.global_batch=6
rc3=$?
run reft 1 --set model.tie_word_embeddings=true --set train.micro_batch=8 --set train.global_batch=8
rct=$?
for r in ref ref3 reft; do
    n=$(wc -l <"$work/$r/metrics.jsonl" 2>/dev/null || echo 0)
    if { [ $r = ref ] && [ $rc -ne 0 ]; } || { [ $r = ref3 ] && [ $rc3 -ne 0 ]; } ||
        { [ $r = reft ] && [ $rct -ne 0 ]; } || [ "$n" -ne $steps ]; then
        tail -n 20 "$work/$r.log"
        echo "fsdp_equivalence: FAIL: the 1-rank reference $r did not run $steps steps" \
            "(log $work/$r.log)"
        exit 1
    fi
done

# the padding run must really pad: no unit size and not the parameter count divide 3
# (unit sizes as llama_layout lays them out; their sum must be the printed count)
pad_check=$(awk '
    $1 == "model.dim" { d = $3 } $1 == "model.n_layers" { L = $3 }
    $1 == "model.n_heads" { nh = $3 } $1 == "model.n_kv_heads" { nkv = $3 }
    $1 == "model.head_dim" { hd = $3 } $1 == "model.ffn_dim" { F = $3 }
    $1 == "model.vocab_size" { V = $3 } $1 == "params" { P = $3 }
    END {
        emb = V * d; blk = 2 * d + (nh + 2 * nkv) * hd * d + d * nh * hd + 3 * F * d
        head = d + V * d
        if (emb + L * blk + head != P) { print "unit sizes do not add up to params " P; exit }
        if (P % 3 == 0 || emb % 3 == 0 || blk % 3 == 0 || head % 3 == 0) {
            print "a size divides 3: params " P ", units " emb ", " blk ", " head; exit
        }
        print "ok: params " P ", units " emb ", " blk " (x" L "), " head " (mod 3: " \
            P % 3 ", " emb % 3 ", " blk % 3 ", " head % 3 ")"
    }' "$work/ref3.log")
echo "padding run shape: $pad_check"
case $pad_check in
ok:*) ;;
*) status=1 ;;
esac

# ---- the matrix ----
# name np ref tol "S R" settings (one word each; tol bf16 also demands a visible effect)
matrix="
full_2r_accum        2 ref  fp32 2,1 fsdp.strategy=FULL_SHARD    train.micro_batch=1 fsdp.activation_checkpointing=none
sgo_2r               2 ref  fp32 2,1 fsdp.strategy=SHARD_GRAD_OP train.micro_batch=4 fsdp.activation_checkpointing=full
noshard_2r_accum     2 ref  fp32 1,2 fsdp.strategy=NO_SHARD      train.micro_batch=1 fsdp.activation_checkpointing=selective
hybrid_2x1           2 ref  fp32 1,2 fsdp.strategy=HYBRID_SHARD  train.micro_batch=4 fsdp.activation_checkpointing=none runtime.ranks_per_node=1
full_4r              4 ref  fp32 4,1 fsdp.strategy=FULL_SHARD    train.micro_batch=2 fsdp.activation_checkpointing=selective
sgo_4r_accum_nopf    4 ref  fp32 4,1 fsdp.strategy=SHARD_GRAD_OP train.micro_batch=1 fsdp.activation_checkpointing=none fsdp.prefetch=false
noshard_4r           4 ref  fp32 1,4 fsdp.strategy=NO_SHARD      train.micro_batch=2 fsdp.activation_checkpointing=full
hybrid_2x2_accum     4 ref  fp32 2,2 fsdp.strategy=HYBRID_SHARD  train.micro_batch=1 fsdp.activation_checkpointing=full runtime.ranks_per_node=2
full_3r_pad_accum    3 ref3 fp32 3,1 fsdp.strategy=FULL_SHARD    train.micro_batch=1 fsdp.activation_checkpointing=selective model.vocab_size=259 train.global_batch=6
full_2r_accum_bf16   2 ref  bf16 2,1 fsdp.strategy=FULL_SHARD    train.micro_batch=1 fsdp.activation_checkpointing=none fsdp.param_dtype=bf16
sgo_4r_bf16          4 ref  bf16 4,1 fsdp.strategy=SHARD_GRAD_OP train.micro_batch=2 fsdp.activation_checkpointing=full fsdp.param_dtype=bf16
noshard_2r_rbf16     2 ref  bf16 1,2 fsdp.strategy=NO_SHARD      train.micro_batch=4 fsdp.activation_checkpointing=full fsdp.reduce_dtype=bf16
hybrid_2x2_bf16_rbf16 4 ref bf16 2,2 fsdp.strategy=HYBRID_SHARD  train.micro_batch=2 fsdp.activation_checkpointing=selective fsdp.param_dtype=bf16 fsdp.reduce_dtype=bf16 runtime.ranks_per_node=2
tied_full_4r_accum   4 reft tied 4,1 fsdp.strategy=FULL_SHARD    train.micro_batch=1 fsdp.activation_checkpointing=none model.tie_word_embeddings=true
tied_hybrid_2x2_accum 4 reft tied 2,2 fsdp.strategy=HYBRID_SHARD train.micro_batch=1 fsdp.activation_checkpointing=selective runtime.ranks_per_node=2 model.tie_word_embeddings=true
tied_sgo_2r_accum    2 reft tied 2,1 fsdp.strategy=SHARD_GRAD_OP train.micro_batch=2 fsdp.activation_checkpointing=full model.tie_word_embeddings=true
tied_noshard_2r      2 reft tied 1,2 fsdp.strategy=NO_SHARD      train.micro_batch=4 fsdp.activation_checkpointing=none model.tie_word_embeddings=true
tied_full_2r_nopf    2 reft tied 2,1 fsdp.strategy=FULL_SHARD    train.micro_batch=4 fsdp.prefetch=false model.tie_word_embeddings=true
tied_full_2r_bf16    2 reft bf16 2,1 fsdp.strategy=FULL_SHARD    train.micro_batch=1 fsdp.param_dtype=bf16 fsdp.reduce_dtype=bf16 model.tie_word_embeddings=true
"

table="$work/table.txt"
: >"$table"
# the matrix as lines, read from a file so that `run` keeps the shell's stdin alone
echo "$matrix" | sed '/^ *$/d' >"$work/matrix.txt"
while read -r name np ref prec sr sets; do
    args=""
    for s in $sets; do args="$args --set $s"; done
    # shellcheck disable=SC2086 # one word per setting, on purpose
    run "$name" "$np" $args
    rc=$?
    got=$(topo "$name")
    want=$(echo "$sr" | tr , ' ')
    d=$(maxrel loss "$work/$ref/metrics.jsonl" "$work/$name/metrics.jsonl" $steps)
    g=$(maxrel grad_norm "$work/$ref/metrics.jsonl" "$work/$name/metrics.jsonl" $steps)
    case $prec in fp32) tol=$tol_fp32 ;; tied) tol=$tol_tied ;; *) tol=$tol_bf16 ;; esac
    verdict=PASS
    if [ $rc -ne 0 ]; then
        verdict="FAIL (exit $rc)"
    elif [ "$got" != "$want" ]; then
        verdict="FAIL (shard,replica = $got, expected $want)"
    elif [ "$d" = missing ] || [ "$g" = missing ]; then
        verdict="FAIL (steps missing)"
    elif awk -v d="$d" -v t="$tol" 'BEGIN { exit !(d > t) }'; then
        verdict="FAIL (loss > $tol)"
    elif [ "$prec" != bf16 ] && awk -v d="$g" -v t="$tol" 'BEGIN { exit !(d > t) }'; then
        verdict="FAIL (grad_norm > $tol)"
    elif [ "$prec" = bf16 ] && awk -v d="$d" -v t="$tol_fp32" 'BEGIN { exit !(d <= t) }'; then
        verdict="FAIL (loss <= $tol_fp32: bf16 not in effect?)"
    fi
    case $verdict in
    FAIL*)
        status=1
        echo "  $name failed; last lines of $work/$name.log:"
        tail -n 8 "$work/$name.log" | sed 's/^/    /'
        ;;
    esac
    printf '%-22s %3s  %-4s %5s  %-10s %-10s %-6s %s\n' "$name" "$np" "$ref" \
        "$(echo "$sr" | tr , x)" "$d" "$g" "$tol" "$verdict" >>"$table"
done <"$work/matrix.txt"

echo
echo "# every step against the 1-rank run ($steps steps; ref3: vocab 259, global_batch 6;"
echo "# reft: tied embeddings): max relative difference of the loss (judged) and of"
echo "# grad_norm (judged in fp32 only)"
printf '# %-20s %3s  %-4s %5s  %-10s %-10s %-6s %s\n' run ranks ref SxR loss_diff \
    gnorm_diff tol verdict
cat "$table"
t_end=$(date +%s)
if [ $status -ne 0 ]; then
    echo "fsdp_equivalence: FAIL ($((t_end - t_start)) s); logs and metrics kept in $work"
    exit 1
fi
echo "fsdp_equivalence: PASS ($((t_end - t_start)) s)"
rm -rf "$work"
exit 0
