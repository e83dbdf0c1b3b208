#!/bin/sh
# benchmarks/gpu_suite.sh where no GPU is: its --dry-run commands on 1, 2 and 8 GPUs (the
# record pair at micro-batch 1 on one GPU and 2 on more, both sides with the same shape,
# strategy and checkpointing; phases that need 2 GPUs left out on one; scaling over
# 1,2,4,8), that it changes no GPU setting (nvidia-smi only queried) and keeps
# NCCL_NVLS_ENABLE=0, one error line for a bad phase; then --cpu: the record pair, the
# collectives and both scaling phases run for real at the tiny shape on 2 CPU ranks, and
# the tables it prints agree with the results it recorded (the ratio is shardlm's tokens/s
# over PyTorch's); the fp8 phase's dry run (shardlm per train.matmul recipe, the anchor's
# torch.compile bf16 and --float8 runs at the record's shape) and its --cpu run: its own
# table, x_bf16 = each row's tokens/s over shardlm bf16's as recorded, the anchor's float8
# runs (eager, torchao's wheel from tests/setup_pyenv.sh installed by the suite) ok, and
# shardlm's fp8 rows ok where this build has train.matmul, else failed naming the key; the
# fp8-variants and fp8-accum phases' dry-run commands and --cpu runs: a table per phase,
# each row's x_bf16 against that phase's own bf16 run.
# The --cpu part needs torch and transformers (tests/pyenv.sh): without
# them it is left out with a note. By hand, from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=SRC sh SRC/tests/gpu_suite_cpu.sh
set -u
. "$SHLM_SRCDIR/tests/lib.sh"
. "$SHLM_SRCDIR/tests/pyenv.sh"
test_begin gpu_suite_cpu gpusuite
suite=$SHLM_SRCDIR/benchmarks/gpu_suite.sh
export TMPDIR=$work

# ---- dry runs ----
dry() { # GPUS PHASES...: the commands in $work/dry-GPUS.txt
    g=$1
    shift
    echo "+ OUT=$work/dry bash $suite --dry-run --gpus $g $*"
    OUT=$work/dry SHLM_BIN=$work/bin bash "$suite" --dry-run --gpus "$g" "$@" > "$work/dry-$g.txt" 2>&1 ||
        fail "--dry-run --gpus $g: exit status $?: $(tail -n 3 "$work/dry-$g.txt")"
}
has() { grep -q -e "$2" "$work/dry-$1.txt" || fail "--gpus $1: no line matching '$2'"; }
hasnt() { ! grep -q -e "$2" "$work/dry-$1.txt" || fail "--gpus $1: a line matches '$2'"; }
for g in 1 2 8; do
    dry $g all
    mb=2
    [ $g = 1 ] && mb=1
    # the record pair: shardlm and both PyTorch modes at one shape
    has $g "mpi_test.sh $g .*shardlm train .*llama2-7b.ini .*train.micro_batch=$mb .*train.global_batch=$((mb * g)) .*fsdp.strategy=FULL_SHARD --set fsdp.activation_checkpointing=none"
    has $g "nproc-per-node=$g .*torch_fsdp2.py --model llama2-7b --seq 4096 --micro-batch $mb --strategy FULL_SHARD --ac none .*--name record-llama2-7b-torch-eager"
    has $g "nproc-per-node=$g .*torch_fsdp2.py --model llama2-7b --seq 4096 --micro-batch $mb --strategy FULL_SHARD --ac none .*--compile --name record-llama2-7b-torch-compile"
    has $g "torch_fsdp2.py --model tinyllama-1b --seq 2048 --micro-batch 8 "
    has $g "check_gpu.sh"
    # the fp8 phase: shardlm per recipe, the anchor's compile bf16 and float8 at the record's shape
    has $g "mpi_test.sh $g .*llama2-7b.ini .*train.micro_batch=$mb .*log.run_dir=.*/fp8-llama2-7b-shardlm\$"
    for r in tensorwise rowwise; do
        has $g "mpi_test.sh $g .*llama2-7b.ini .*train.micro_batch=$mb .*--set train.matmul=fp8-$r --set log.run_dir=.*/fp8-llama2-7b-shardlm-fp8-$r\$"
        has $g "torch_fsdp2.py --model llama2-7b --seq 4096 --micro-batch $mb --strategy FULL_SHARD --ac none .*--compile --float8 $r --name fp8-llama2-7b-torch-compile-float8-$r "
    done
    has $g "torch_fsdp2.py --model llama2-7b --seq 4096 --micro-batch $mb --strategy FULL_SHARD --ac none .*--compile --name fp8-llama2-7b-torch-compile "
    hasnt $g "float8-all-gather"
    # fp8-variants: fp32 accumulation and the bf16 gather; fp8-accum: 16 micro-batches
    v=".*train.global_batch=$((mb * g)) .*--set train.matmul=fp8-tensorwise"
    has $g "mpi_test.sh $g .*llama2-7b.ini$v --set train.fp8_fast_accum=false --set log.run_dir=.*/fp8-variants-llama2-7b-shardlm-fp8-tensorwise-fp32_accum\$"
    has $g "mpi_test.sh $g .*llama2-7b.ini$v --set fsdp.fp8_all_gather=false --set log.run_dir=.*/fp8-variants-llama2-7b-shardlm-fp8-tensorwise-bf16_gather\$"
    has $g "mpi_test.sh $g .*llama2-7b.ini .*train.steps=4 .*train.global_batch=$((mb * g * 16)) .*log.run_dir=.*/fp8-accum-llama2-7b-ga16-shardlm\$"
    has $g "mpi_test.sh $g .*llama2-7b.ini .*train.steps=4 .*train.global_batch=$((mb * g * 16)) .*--set train.matmul=fp8-tensorwise --set log.run_dir=.*/fp8-accum-llama2-7b-ga16-shardlm-fp8-tensorwise\$"
    has $g "bench_kernels"
    has $g "ceilings.py"
done
OUT=$work/dry SHLM_BIN=$work/bin bash "$suite" --dry-run --gpus 1 --float8-all-gather fp8 > "$work/dry-f8.txt" 2>&1
has f8 "--compile --float8 tensorwise --float8-all-gather --name "
hasnt f8 "float8 rowwise --float8-all-gather"
has 1 "^shard-grad-op: needs 2 or more GPUs"
has 1 "^scaling: needs 2 or more GPUs"
hasnt 1 "strong_scaling.sh"
has 2 "torch_fsdp2.py --model llama2-7b --seq 4096 --micro-batch 2 --strategy SHARD_GRAD_OP --ac none"
has 2 "mpi_test.sh 2 .*bench_comm --backend nccl"
has 8 "strong_scaling.sh --ranks 1,2,4,8 .*--global-batch 16 "
has 8 "strong_scaling.sh --weak --ranks 1,2,4,8 .*--global-batch 1 "
# what the suite may ask nvidia-smi: -L, --query-gpu, topo -m; never a setting
calls=$(grep 'nvidia-smi ' "$suite" | grep -v '^ *#' | grep -v 'nvidia-smi -L lists' |
    grep -o 'nvidia-smi [^|)>;&]*' | sed 's/^nvidia-smi //')
bad=$(printf '%s\n' "$calls" | grep -vE '^(-L|--query-gpu=|topo -m)')
bad="$bad$(printf '%s\n' "$calls" | grep -E -e '(^| )-(pm|pl|lgc|rgc|lmc|rmc|ac|rac|mig|r|c|e)( |$)' \
    -e '--(gpu-reset|persistence-mode|power-limit|lock-gpu-clocks|applications-clocks|compute-mode)')"
[ "$(printf '%s\n' "$calls" | grep -c .)" -ge 4 ] || fail "fewer nvidia-smi calls found than the suite makes"
[ -z "$bad" ] || fail "nvidia-smi called with something other than a query: $bad"
grep -q '^export NCCL_NVLS_ENABLE=0$' "$suite" || fail "the suite does not export NCCL_NVLS_ENABLE=0"
OUT=$work/dry bash "$suite" --dry-run --gpus 1 recrod > /dev/null 2> "$work/badphase.err"
rc=$?
[ $rc = 2 ] && [ "$(wc -l < "$work/badphase.err")" = 1 ] && grep -q "^gpu_suite: error: unknown phase 'recrod'" "$work/badphase.err" ||
    fail "an unknown phase: exit $rc, stderr: $(cat "$work/badphase.err")"

# ---- --cpu: every table from real runs ----
if ! shlm_python torch transformers > "$work/py.txt"; then
    skip_part "the --cpu runs: $(cat "$work/py.txt")"
elif ! sh "$SHLM_SRCDIR/tests/mpi_test.sh" 1 true > /dev/null 2>&1; then
    skip_part "the --cpu runs: no MPI launcher"
else
    echo "+ OUT=$work/cpu PYTHON=$SHLM_PY bash $suite --cpu --repeat 1 record comm scaling weak-scaling"
    OUT=$work/cpu PYTHON=$SHLM_PY MPIRUN=${MPIRUN:-mpirun} bash "$suite" --cpu --repeat 1 \
        record comm scaling weak-scaling > "$work/cpu.txt" 2>&1
    rc=$?
    [ $rc = 0 ] || { tail -n 30 "$work/cpu.txt"; fail "--cpu: exit status $rc"; }
    "$SHLM_PY" - "$work/cpu/results.jsonl" "$work/cpu.txt" <<'EOF' || fail "--cpu: results and tables disagree"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = open(sys.argv[2]).read().splitlines()
train = {r["system"]: r for r in rows if r["kind"] == "train" and r["phase"] == "record"}
assert set(train) == {"shardlm", "torch eager"}, f"record rows: {sorted(train)}"
for r in train.values():
    assert r["status"] == "ok" and r["tokens_per_s_per_gpu"] > 0 and r["gpus"] == 2 and r["mb"] == 2, r
ratio = train["shardlm"]["tokens_per_s_per_gpu"] / train["torch eager"]["tokens_per_s_per_gpu"]
line = [l for l in out if l.startswith("   record") and " torch eager " in l]
assert len(line) == 1, f"{len(line)} table lines for the eager row"
assert line[0].split()[-1] == f"{ratio:.3f}", f"table says {line[0].split()[-1]}, results {ratio:.3f}"
comm = [r for r in rows if r["kind"] == "comm"]
assert len(comm) == 3 * 2 * 2 and all(r["wrong"] == 0 and r["torch_busbw"] for r in comm), comm
modes = sorted((r["mode"], r["gpus"]) for r in rows if r["kind"] == "scaling")
assert modes == [("strong", 1), ("strong", 2), ("weak", 1), ("weak", 2)], modes
print(f"--cpu: {len(rows)} results; record ratio {ratio:.3f} as printed")
EOF
    # the fp8 phase: exit 1 while any run fails (shardlm's fp8 runs, on a build without the key)
    has_matmul=False have_whl=False
    "$SHLM" keys 2>/dev/null | grep -q '^  train\.matmul ' && has_matmul=True
    f8_whl=$(ls "$SHLM_CACHE"/wheels/torchao-0.18.0-*.whl 2>/dev/null | tail -n 1)
    [ -n "$f8_whl" ] && have_whl=True
    echo "+ OUT=$work/cpu8 PYTHON=$SHLM_PY bash $suite --cpu fp8   (train.matmul in this build: $has_matmul)"
    OUT=$work/cpu8 PYTHON=$SHLM_PY TORCHAO_WHEEL=$f8_whl \
        MPIRUN=${MPIRUN:-mpirun} bash "$suite" --cpu fp8 > "$work/cpu8.txt" 2>&1
    rc=$?
    want_rc=1
    [ $has_matmul = True ] && [ $have_whl = True ] && want_rc=0
    [ $rc = $want_rc ] || { tail -n 30 "$work/cpu8.txt"; fail "--cpu fp8: exit status $rc, want $want_rc"; }
    "$SHLM_PY" - "$work/cpu8/results.jsonl" "$work/cpu8.txt" "$has_matmul" "$have_whl" <<'EOF' || fail "--cpu fp8: results and table disagree"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = open(sys.argv[2]).read().splitlines()
has_matmul, have_whl = sys.argv[3] == "True", sys.argv[4] == "True"
got = {(r["system"], r["matmul"]): r for r in rows if r["kind"] == "train" and r["phase"] == "fp8"}
want = {("shardlm", m) for m in ("bf16", "fp8-tensorwise", "fp8-rowwise")} | \
       {("torch eager", m) for m in ("bf16", "float8 tensorwise", "float8 rowwise")}
assert set(got) == want, f"fp8 rows: {sorted(got)}"
base = got[("shardlm", "bf16")]
assert base["status"] == "ok" and got[("torch eager", "bf16")]["status"] == "ok", base
for m in ("fp8-tensorwise", "fp8-rowwise"):
    r = got[("shardlm", m)]
    if has_matmul:
        assert r["status"] == "ok", r
    else:
        assert r["status"] == "failed" and "matmul" in (r.get("why") or ""), r
title = [i for i, l in enumerate(out) if l.startswith("## fp8 (phase fp8)")]
assert len(title) == 1, "no fp8 table"
lines = out[title[0] + 2:title[0] + 8]
for (system, m), r in got.items():
    line = [l for l in lines if l.startswith("   tiny") and f" {system} " in l and f" {m} " in l]
    assert len(line) == 1, f"{len(line)} table lines for {system} {m}"
    if r["status"] == "ok":
        x = r["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
        assert f" {x:.3f} " in line[0], f"{system} {m}: table line {line[0]!r}, x_bf16 {x:.3f}"
    else:
        assert "FAILED: " in line[0], line[0]
float8 = [got[("torch eager", m)] for m in ("float8 tensorwise", "float8 rowwise")]
assert not have_whl or all(r["status"] == "ok" for r in float8), float8
print(f"--cpu fp8: {len(got)} rows, the table's x_bf16 as recorded; float8 anchors: "
      + ", ".join(r["status"] for r in float8))
EOF
    # fp8-variants and fp8-accum: a table per phase, each row against its own phase's bf16
    if [ $has_matmul = True ]; then
        echo "+ OUT=$work/cpuv bash $suite --cpu fp8-variants fp8-accum"
        OUT=$work/cpuv PYTHON=$SHLM_PY MPIRUN=${MPIRUN:-mpirun} bash "$suite" --cpu fp8-variants fp8-accum \
            > "$work/cpuv.txt" 2>&1 || { tail -n 30 "$work/cpuv.txt"; fail "--cpu fp8-variants fp8-accum: exit status $?"; }
        "$SHLM_PY" - "$work/cpuv/results.jsonl" "$work/cpuv.txt" <<'EOF' || fail "--cpu fp8-variants fp8-accum: results and tables disagree"
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "train"]
out = open(sys.argv[2]).read().splitlines()
want = {"fp8-variants": ["bf16", "fp8-tensorwise", "fp8-tensorwise+fp32_accum",
                         "fp8-tensorwise+bf16_gather"],
        "fp8-accum": ["bf16", "fp8-tensorwise"]}
for phase, recipes in want.items():
    got = {r["matmul"]: r for r in rows if r["phase"] == phase}
    assert sorted(got) == sorted(recipes) and all(r["status"] == "ok" for r in got.values()), (phase, got)
    title = [i for i, l in enumerate(out) if l.startswith(f"## fp8 (phase {phase}")]
    assert len(title) == 1, f"{len(title)} tables for {phase}"
    lines = out[title[0] + 2:title[0] + 2 + len(recipes)]
    for m, r in got.items():
        line = [l for l in lines if f" {m} " in l]
        x = r["tokens_per_s_per_gpu"] / got["bf16"]["tokens_per_s_per_gpu"]
        assert len(line) == 1 and f" {x:.3f} " in line[0], (phase, m, line, x)
print(f"--cpu fp8-variants fp8-accum: {len(rows)} rows, x_bf16 against each phase's own bf16")
EOF
    fi
fi

test_end
