#!/bin/sh
# benchmarks/fp8/parity.sh on the cpu backend at a shrunken shape (2 layers, d 64, vocab
# 256, 4 steps on random tokens), where it checks its bookkeeping and measures nothing:
#  1. bf16 and fp8-tensorwise run; bf16's row holds its metrics.jsonl's last val_loss and
#     val_loss.csv its curve; fp8-tensorwise is ok with its relative difference to bf16
#     where this build has train.matmul, else a FAILED row naming the key and exit 1.
#  2. --report on run dirs whose validation loss is bf16's x 1.02: +2.000%, "NO" and exit 1
#     at the default 1%; "yes" and exit 0 with --tolerance 3.
#  3. --seeds 5,6: each seed's runs under seed-S with train.seed = S (bf16's
#     losses differ between the seeds); --report --seeds on run dirs 2% above bf16 at one
#     seed and 1% below at the other: the mean paired difference +0.500% decides ("yes" and
#     exit 0 at 1%, "NO" and exit 1 at 0.4%), the per-seed rows still say +2.000 and -1.000.
#  4. An unknown recipe, a repeated one, a repeated or non-numeric seed, a missing data dir:
#     one error line, exit 2.
#   SHLM=./shardlm SHLM_SRCDIR=. sh tests/fp8_parity.sh
set -u
. "$SHLM_SRCDIR/tests/lib.sh"
test_begin fp8_parity fp8parity
parity=$SHLM_SRCDIR/benchmarks/fp8/parity.sh
command -v python3 > /dev/null || skip_test "no python3 for parity.sh's table"
mkdir -p "$work/data"
for f in train val; do
    "$SHLM" data random --vocab 256 --tokens 20000 --seed 7 "$work/data/$f.bin" > /dev/null ||
        { echo "fp8_parity: shardlm data random failed"; exit 99; }
done
small="--set model.dim=64 --set model.n_layers=2 --set model.n_heads=2 --set model.n_kv_heads=1
--set model.ffn_dim=128 --set model.vocab_size=256 --set train.seq_len=32 --set train.micro_batch=2
--set train.eval_batches=2 --set runtime.threads=1"
has_matmul=0
"$SHLM" keys 2> /dev/null | grep -q '^  train\.matmul ' && has_matmul=1

# ---- 1. two recipes on the cpu backend
echo "+ SHLM=$SHLM bash $parity --cpu --steps 4 --eval-every 2 --data $work/data --out $work/out $(echo $small) bf16 fp8-tensorwise"
# shellcheck disable=SC2086 # $small is words
SHLM=$SHLM bash "$parity" --cpu --steps 4 --eval-every 2 --data "$work/data" --out "$work/out" $small \
    bf16 fp8-tensorwise > "$work/run.txt" 2>&1
rc=$?
[ $rc = $((1 - has_matmul)) ] || { cat "$work/run.txt"; fail "exit status $rc with train.matmul known: $has_matmul"; }
python3 - "$work/out" "$work/run.txt" "$has_matmul" <<'EOF' || fail "the table disagrees with the runs"
import json, sys
out, txt, has_matmul = sys.argv[1], open(sys.argv[2]).read().splitlines(), sys.argv[3] == "1"
rows = {r["recipe"]: r for r in map(json.loads, open(f"{out}/parity.jsonl"))}
metrics = [json.loads(l) for l in open(f"{out}/bf16/metrics.jsonl")]
vals = [(m["step"], m["val_loss"]) for m in metrics if "val_loss" in m]
b = rows["bf16"]
assert b["status"] == "ok" and b["val_loss"] == vals[-1][1] and [s for s, _ in vals] == [2, 4], (b, vals)
line = [l for l in txt if l.startswith("   bf16 ")]
assert len(line) == 1 and line[0].split()[1] == f"{vals[-1][1]:.4f}", line
csv = open(f"{out}/val_loss.csv").read().splitlines()
assert csv[0] == "step,bf16,fp8-tensorwise" and csv[2].startswith(f"4,{vals[-1][1]:.6f},"), csv
f = rows["fp8-tensorwise"]
fline = [l for l in txt if l.startswith("   fp8-tensorwise ")]
if has_matmul:
    want = 100 * (f["val_loss"] - b["val_loss"]) / b["val_loss"]
    assert f["status"] == "ok" and abs(f["rel_diff_pct"] - want) < 1e-12, f
    assert fline[0].split()[3] == f"{want:+.3f}", fline
else:
    assert f["status"] == "failed" and "matmul" in f["why"], f
    assert "FAILED: " in fline[0] and "matmul" in fline[0], fline
print(f"fp8_parity: bf16 val_loss {b['val_loss']:.4f} as recorded; fp8-tensorwise {f['status']}")
EOF

# ---- 2. --report: a recipe 2% above bf16
mkdir -p "$work/rep/fp8-rowwise"
cp -r "$work/out/bf16" "$work/rep/bf16"
python3 - "$work/out/bf16/metrics.jsonl" "$work/rep/fp8-rowwise/metrics.jsonl" <<'EOF'
import json, sys
with open(sys.argv[2], "w") as f:
    for m in map(json.loads, open(sys.argv[1])):
        if "val_loss" in m:
            m["val_loss"] *= 1.02
        f.write(json.dumps(m) + "\n")
EOF
report() { # TOLERANCE WANT_RC WITHIN
    echo "+ bash $parity --report --out $work/rep --steps 4 --tolerance $1 bf16 fp8-rowwise"
    SHLM=$SHLM bash "$parity" --report --out "$work/rep" --steps 4 --tolerance "$1" bf16 fp8-rowwise > "$work/rep.txt" 2>&1
    rr=$?
    line=$(grep '^   fp8-rowwise ' "$work/rep.txt")
    [ $rr = "$2" ] && [ "$(echo "$line" | awk '{ print $4, $5 }')" = "+2.000 $3" ] ||
        fail "--report --tolerance $1: exit $rr (want $2), line '$line' (want +2.000 $3)"
}
report 1 1 NO
report 3 0 yes

# ---- 3. seeds: two real ones at once, then the paired mean over made-up run dirs
echo "+ SHLM=$SHLM bash $parity --cpu --steps 4 --eval-every 2 --data $work/data --out $work/seeds --seeds 5,6 ... bf16"
# shellcheck disable=SC2086 # $small is words
SHLM=$SHLM bash "$parity" --cpu --steps 4 --eval-every 2 --data "$work/data" --out "$work/seeds" \
    --seeds 5,6 $small bf16 > "$work/seeds.txt" 2>&1 || { cat "$work/seeds.txt"; fail "--seeds 5,6: exit $?"; }
python3 - "$work/seeds" <<'EOF' || fail "--seeds: the runs or their rows are wrong"
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/parity.jsonl")]
per = {r["seed"]: r for r in rows if not r.get("summary")}
assert sorted(per) == [5, 6] and all(r["status"] == "ok" for r in per.values()), rows
for s in (5, 6):
    m = [json.loads(l) for l in open(f"{out}/seed-{s}/bf16/metrics.jsonl")]
    assert per[s]["val_loss"] == [x["val_loss"] for x in m if "val_loss" in x][-1], (s, per[s])
    # the job the run printed: the seed is the one its directory names
    assert any(l.split() == ["train.seed", "=", str(s)] for l in open(f"{out}/seed-{s}/bf16.log")), s
assert per[5]["val_loss"] != per[6]["val_loss"], per
summ = [r for r in rows if r.get("summary")]
assert len(summ) == 1 and summ[0]["seeds"] == 2, summ
print(f"fp8_parity: seeds 5 and 6: bf16 val_loss {per[5]['val_loss']:.4f} and {per[6]['val_loss']:.4f}")
EOF
for s in 1 2; do
    mkdir -p "$work/prep/seed-$s/fp8-rowwise"
    cp -r "$work/seeds/seed-$((s + 4))/bf16" "$work/prep/seed-$s/bf16"
    python3 - "$work/prep/seed-$s/bf16/metrics.jsonl" "$work/prep/seed-$s/fp8-rowwise/metrics.jsonl" "$s" <<'EOF'
import json, sys
with open(sys.argv[2], "w") as f:
    for m in map(json.loads, open(sys.argv[1])):
        if "val_loss" in m:
            m["val_loss"] *= 1.02 if sys.argv[3] == "1" else 0.99
        f.write(json.dumps(m) + "\n")
EOF
done
seeds_report() { # TOLERANCE WANT_RC WITHIN
    echo "+ bash $parity --report --out $work/prep --seeds 1,2 --steps 4 --tolerance $1 bf16 fp8-rowwise"
    SHLM=$SHLM bash "$parity" --report --out "$work/prep" --seeds 1,2 --steps 4 --tolerance "$1" bf16 fp8-rowwise > "$work/prep.txt" 2>&1
    rr=$?
    per=$(grep '^   fp8-rowwise ' "$work/prep.txt" | awk '{ print $4 }' | tr '\n' ' ')
    line=$(grep '^   fp8-rowwise ' "$work/prep.txt" | tail -n 1)
    [ $rr = "$2" ] && [ "$per" = "+2.000 -1.000 +0.500 " ] && [ "$(echo "$line" | awk '{ print $4, $5, $6, $7 }')" = "+0.500 -1.000 +2.000 $3" ] ||
        fail "--report --seeds 1,2 --tolerance $1: exit $rr (want $2), per-seed '$per', summary '$line' (want +0.500 ... $3)"
}
seeds_report 1 0 yes
seeds_report 0.4 1 NO

# ---- 4. bad usage: one line, exit 2
bad() { # WHAT ARGS...
    what=$1
    shift
    bash "$parity" --dry-run "$@" > /dev/null 2> "$work/bad.err"
    br=$?
    [ $br = 2 ] && [ "$(wc -l < "$work/bad.err")" = 1 ] && grep -q "^parity: error: .*$what" "$work/bad.err" ||
        fail "$*: exit $br, stderr: $(cat "$work/bad.err")"
}
bad "unknown recipe 'fp16'" fp16
bad "recipe bf16 given twice" bf16 bf16
bad "unknown recipe 'fp8-columnwise+fast_accum'" fp8-columnwise+fast_accum
bad "seed 3 given twice" --seeds 3,4,3
bad "not a whole number: 'x'" --seeds 3,x
SHLM=$SHLM bash "$parity" --data "$work/nowhere" --out "$work/o3" bf16 > /dev/null 2> "$work/bad.err"
br=$?
[ $br = 2 ] && [ "$(wc -l < "$work/bad.err")" = 1 ] && grep -q "^parity: error: no $work/nowhere/train.bin" "$work/bad.err" ||
    fail "a missing data dir: exit $br, stderr: $(cat "$work/bad.err")"

[ $fails -eq 0 ] || { echo "fp8_parity: $fails failure(s); work directory $work kept"; exit 1; }
rm -rf "$work"
echo "fp8_parity: PASS ($(($(date +%s) - t_start)) s)"
