#!/bin/sh
# The PyTorch anchor (benchmarks/anchor/) on the CPU, where it checks itself and measures
# nothing: torch_fsdp2.py builds shardlm's shapes (its parameter count equals `shardlm plan`'s
# for every preset it knows, so both sides count the same FLOPs), trains the tiny shape on
# 1 gloo rank (FULL_SHARD, no checkpointing) and 2 (SHARD_GRAD_OP, full checkpointing),
# each printing one valid JSON line whose figures follow from its step times by shardlm's
# formulas (tokens/s/GPU = micro-batch x seq / step; TFLOP/s = (6 N + 12 L d T) x tokens/s;
# MFU = TFLOP/s / 989) and whose first loss is ln 256 within 0.1 (uniform predictions at
# init, so the model and the loss are the real ones); ceilings.py and nccl_busbw.py at
# their CPU sizes find 0 wrong results. With torchao's wheel, --float8 tensorwise and rowwise
# (emulated on the CPU) convert the 28 linear layers of the tiny shape's 4 decoder layers
# and not the LM head, on 1 rank and, with the float8 all-gather, on 2, each a JSON line
# that passes the same checks; --float8-all-gather with rowwise is one error line.
# Skipped without torch and transformers (tests/pyenv.sh). By hand, from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=SRC sh SRC/tests/anchor_cpu.sh
set -u
. "$SHLM_SRCDIR/tests/lib.sh"
. "$SHLM_SRCDIR/tests/pyenv.sh"
shlm_python torch transformers >/dev/null || skip_test "$(shlm_python torch transformers)"
test_begin anchor_cpu anchor
anchor=$SHLM_SRCDIR/benchmarks/anchor
export OMP_NUM_THREADS=1

# the shapes: N from the anchor's model equals shardlm's
for m in tiny tinyllama-1b llama2-7b llama2-13b; do
    echo "+ $SHLM_PY $anchor/torch_fsdp2.py --model $m --count"
    theirs=$("$SHLM_PY" "$anchor/torch_fsdp2.py" --model "$m" --count |
        "$SHLM_PY" -c 'import json, sys; print(json.loads(sys.stdin.read())["n_params"])')
    ours=$(printf '[model]\npreset = %s\n[train]\nseq_len = 128\nsteps = 1\n[data]\ntrain = x.bin\n' "$m" > "$work/$m.ini" &&
        "$SHLM" plan "$work/$m.ini" --ranks 1 | sed -n 's/^# model [^:]*: \([0-9]*\) parameters.*/\1/p')
    [ -n "$theirs" ] && [ "$theirs" = "$ours" ] ||
        fail "$m: the anchor's model has ${theirs:-no} parameters, shardlm's ${ours:-no}"
done

# CHECK FILE MB WORLD STRATEGY AC [GA]: the run's JSON line against the formulas (GA: the
# micro-batches accumulated a step, default 1)
check_json() {
    "$SHLM_PY" - "$@" <<'EOF'
import json, math, sys
path, mb, world, strategy, ac = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
ga = int(sys.argv[6]) if len(sys.argv) > 6 else 1
lines = [l for l in open(path) if l.startswith("{")]
assert len(lines) == 1, f"{len(lines)} JSON lines, want 1"
r = json.loads(lines[0])
want = dict(model="tiny", n_params=803968, seq=128, micro_batch=mb, grad_accum=ga, world=world,
            strategy=strategy,
            ac=ac, device="cpu", param_dtype="bf16", reduce_dtype="fp32", attn="sdpa",
            weight_decay=0.1, grad_clip=1.0, lr=3e-4)
for k, v in want.items():
    assert r[k] == v, f"{k} = {r[k]!r}, want {v!r}"
assert len(r["step_ms"]) == r["warmup"] + r["steps"] and all(t > 0 for t in r["step_ms"])
timed = r["step_ms"][r["warmup"]:]
mean = sum(timed) / len(timed)
fpt = 6 * 803968 + 12 * 4 * 128 * 128
checks = dict(step_ms_mean=mean, tokens_per_s_per_gpu=ga * mb * 128 / (mean / 1000),
              flops_per_token=fpt, tflops_per_gpu=fpt * ga * mb * 128 / (mean / 1000) / 1e12)
checks["mfu"] = checks["tflops_per_gpu"] / 989.0
for k, v in checks.items():
    assert math.isclose(r[k], v, rel_tol=1e-9), f"{k} = {r[k]}, want {v}"
assert abs(r["losses"][0] - math.log(256)) < 0.1, f"first loss {r['losses'][0]}, want ln 256 = {math.log(256):.3f}"
assert all(math.isfinite(x) for x in r["losses"] + r["grad_norms"])
assert r["mem_peak_bytes"] > 0
print(f"{path}: JSON line checked ({r['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f})")
EOF
}
anchor_run() { # NAME WORLD ARGS...
    name=$1 np=$2
    shift 2
    echo "+ $SHLM_PY -m torch.distributed.run --standalone --nproc-per-node=$np $anchor/torch_fsdp2.py $*"
    timeout 300 "$SHLM_PY" -m torch.distributed.run --standalone --nproc-per-node="$np" \
        "$anchor/torch_fsdp2.py" "$@" > "$work/$name.out" 2> "$work/$name.err"
    ar_rc=$?
    [ $ar_rc = 0 ] || { tail -n 5 "$work/$name.err"; fail "$name: exit status $ar_rc"; return 1; }
}
anchor_run one 1 --model tiny --device cpu --micro-batch 2 --warmup 1 --steps 2 --json "$work/one.json" &&
    { check_json "$work/one.out" 2 1 FULL_SHARD none || fail "one: JSON line"; }
anchor_run two 2 --model tiny --device cpu --micro-batch 1 --grad-accum 2 --strategy SHARD_GRAD_OP \
    --ac full --warmup 1 --steps 2 --json "$work/two.json" &&
    { check_json "$work/two.out" 1 2 SHARD_GRAD_OP full 2 || fail "two: JSON line"; }
# --json FILE holds the same line as stdout
[ -s "$work/one.json" ] && grep '^{' "$work/one.out" | cmp -s - "$work/one.json" ||
    fail "--json FILE differs from the JSON line printed"
# a bad argument: one error line, exit 2
"$SHLM_PY" "$anchor/torch_fsdp2.py" --model tiny --micro-batch 0 > /dev/null 2> "$work/bad.err"
rc=$?
[ $rc = 2 ] && [ "$(wc -l < "$work/bad.err")" = 1 ] && grep -q '^torch_fsdp2: error: ' "$work/bad.err" ||
    fail "--micro-batch 0: exit $rc, stderr: $(cat "$work/bad.err")"

# float8 (torchao's, emulated): the decoder layers' 4 x 7 linear layers converted, the LM
# head not; the run's line passes check_json's checks and names the recipe
check_float8() { # OUT RECIPE ALL_GATHER(True|False)
    "$SHLM_PY" - "$@" <<'EOF'
import json, sys
path, recipe, gather = sys.argv[1], sys.argv[2], sys.argv[3] == "True"
r = json.loads([l for l in open(path) if l.startswith("{")][0])
want = dict(float8=recipe, float8_linears=28, float8_emulated=True, float8_all_gather=gather)
for k, v in want.items():
    assert r[k] == v, f"{k} = {r[k]!r}, want {v!r}"
assert r["torchao"], "no torchao version"
header = [l for l in open(path) if l.startswith("# torch_fsdp2:")]
assert header and f"float8 {recipe} on 28 linear layers (emulated" in header[0], header
print(f"{path}: float8 {recipe} on 28 linear layers, all-gather {gather}")
EOF
}
# torchao from its cached wheel (tests/setup_pyenv.sh), into this test's own directory
f8_whl=$(ls "$SHLM_CACHE"/wheels/torchao-0.18.0-*.whl 2>/dev/null | tail -n 1)
if [ -n "$f8_whl" ] && "$SHLM_PY" -m pip install -q --disable-pip-version-check --no-deps --no-index \
    --target "$work/torchao" "$f8_whl" > "$work/torchao.log" 2>&1; then
    export PYTHONPATH="$work/torchao${PYTHONPATH:+:$PYTHONPATH}"
    for r in tensorwise rowwise; do
        anchor_run "f8-$r" 1 --model tiny --device cpu --micro-batch 2 --warmup 1 --steps 2 --float8 "$r" &&
            { check_json "$work/f8-$r.out" 2 1 FULL_SHARD none && check_float8 "$work/f8-$r.out" "$r" False ||
                fail "--float8 $r: JSON line"; }
    done
    anchor_run f8-gather 2 --model tiny --device cpu --micro-batch 1 --warmup 1 --steps 2 \
        --float8 tensorwise --float8-all-gather &&
        { check_json "$work/f8-gather.out" 1 2 FULL_SHARD none &&
            check_float8 "$work/f8-gather.out" tensorwise True || fail "--float8-all-gather: JSON line"; }
    "$SHLM_PY" "$anchor/torch_fsdp2.py" --model tiny --float8 rowwise --float8-all-gather > /dev/null 2> "$work/bad8.err"
    rc=$?
    [ $rc = 2 ] && [ "$(wc -l < "$work/bad8.err")" = 1 ] && grep -q '^torch_fsdp2: error: --float8-all-gather' "$work/bad8.err" ||
        fail "--float8 rowwise --float8-all-gather: exit $rc, stderr: $(cat "$work/bad8.err")"
else
    skip_part "--float8: no torchao wheel in $SHLM_CACHE/wheels that installs (tests/setup_pyenv.sh downloads it)"
fi

echo "+ $SHLM_PY $anchor/ceilings.py --device cpu"
"$SHLM_PY" "$anchor/ceilings.py" --device cpu > "$work/ceil.out" 2>&1 && grep -q '^# 0 wrong' "$work/ceil.out" ||
    { cat "$work/ceil.out"; fail "ceilings.py --device cpu"; }
echo "+ $SHLM_PY -m torch.distributed.run --standalone --nproc-per-node=2 $anchor/nccl_busbw.py --device cpu --sizes 64K"
timeout 120 "$SHLM_PY" -m torch.distributed.run --standalone --nproc-per-node=2 "$anchor/nccl_busbw.py" \
    --device cpu --sizes 64K > "$work/nb.out" 2>&1 &&
    [ "$(grep -cE '^   (all_gather|reduce_scatter|all_reduce) ' "$work/nb.out")" = 6 ] &&
    grep -q '^# 0 wrong' "$work/nb.out" || { cat "$work/nb.out"; fail "nccl_busbw.py --device cpu"; }

test_end
