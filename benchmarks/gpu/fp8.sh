#!/bin/bash
# The cuda backend's FP8 matmul on a GPU machine that builds nothing (benchmarks/gpu/README.md:
# the carried .gpu folder that benchmarks/gpu/stage.sh fills). From the repository root:
#     bash benchmarks/gpu/fp8.sh [DIR]          # DIR: the carried folder, default .gpu
# 1. test_ops --backend cuda --group fp8: the FP8 cast, scaling rule and scaled GEMM of the
#    cuda backend against the double reference and the cpu backend
# 2. bench_kernels --mb 2 --only fp8 (M = 8192 tokens, Llama-2-7B shapes): the quantize
#    kernels' GB/s, the FP8 products of every linear layer of a block (forward, dgrad,
#    wgrad; tensorwise and rowwise; the forward with fast accumulation too) beside bf16,
#    each checked against the cpu backend
# Logs go to $OUT (else ./fp8-logs); the last lines are a table: TFLOP/s per layer and
# form, bf16 against each FP8 recipe, and the quantize kernels' GB/s.
# Exit status: 0, 1 when a test or a check failed, 2 when the carried folder is not usable.
set -u
dir=${1:-.gpu}
log=${OUT:-./fp8-logs}
mkdir -p "$log" || exit 2
# shellcheck disable=SC1091 # sourced from the tree
source benchmarks/gpu/activate.sh "$dir" || exit 2
for b in test_ops bench_kernels; do
    [ -x "$SHLM_BIN/$b" ] || { echo "fp8.sh: error: no $SHLM_BIN/$b (benchmarks/gpu/stage.sh)" >&2; exit 2; }
done
status=0

echo "+ $SHLM_BIN/test_ops --backend cuda --group fp8 > $log/test_ops_fp8.log"
"$SHLM_BIN/test_ops" --backend cuda --group fp8 > "$log/test_ops_fp8.log" 2>&1
rc=$?
[ $rc = 0 ] || status=1
tail -n 3 "$log/test_ops_fp8.log"
echo "fp8.sh: test_ops fp8 exit $rc"

echo "+ $SHLM_BIN/bench_kernels --mb 2 --only fp8 > $log/bench_fp8.log"
"$SHLM_BIN/bench_kernels" --mb 2 --only fp8 > "$log/bench_fp8.log" 2> "$log/bench_fp8.err"
rc=$?
[ $rc = 0 ] || status=1
grep -h 'WRONG\|warning\|error' "$log/bench_fp8.err" | head -n 20
grep '^# .* fwd: rel_l2' "$log/bench_fp8.log"
echo "fp8.sh: bench_kernels exit $rc"

# bench_kernels' rows: "  %-22s %-30s %10.1f %9s %9s %9s %7d" (op, shape, us, TFLOP/s,
# GB/s, %ceiling, #wrong); the op of a product is "RECIPE FORM LAYER"
awk '
function trim(s) { sub(/^ +/, "", s); sub(/ +$/, "", s); return s }
/^  / {
    op = trim(substr($0, 3, 22)); n = split(substr($0, 57), f, " ")
    if (n < 5) next
    wrong += f[5]
    if (op ~ /^fp8_quantize/) { q[++nq] = sprintf("%-18s %-26s %7s GB/s %6s%% of copy", op, trim(substr($0, 26, 30)), f[3], f[4]); next }
    if (split(op, w, " ") != 3 || w[2] !~ /^(fwd|dgrad|wgrad)$/) next
    key = w[3] " " w[2]
    if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
    t[key, w[1]] = f[2]
}
/^# ceilings:/ { ceil = $0 }
END {
    printf "\n# fp8.sh: TFLOP/s at M = 8192 tokens (x: over bf16); %s\n", substr(ceil, 3)
    printf "%-14s %8s %8s %8s %8s %8s %7s %7s\n", "layer form", "bf16", "fp8-tw", "fp8-rw", "tw+fa", "rw+fa", "tw x", "rw x"
    for (i = 1; i <= nk; i++) {
        k = order[i]; b = t[k, "bf16"] + 0
        twfa = "-"; rwfa = "-"; twx = "-"; rwx = "-"
        if ((k, "fp8-tw+fa") in t) twfa = t[k, "fp8-tw+fa"]
        if ((k, "fp8-rw+fa") in t) rwfa = t[k, "fp8-rw+fa"]
        if (b > 0) { twx = sprintf("%.2f", t[k, "fp8-tw"] / b); rwx = sprintf("%.2f", t[k, "fp8-rw"] / b) }
        printf "%-14s %8s %8s %8s %8s %8s %7s %7s\n", k, t[k, "bf16"], t[k, "fp8-tw"], t[k, "fp8-rw"], twfa, rwfa, twx, rwx
    }
    for (i = 1; i <= nq; i++) print q[i]
    printf "# %d wrong in bench_kernels\n", wrong
}' "$log/bench_fp8.log"
echo "fp8.sh: exit $status (logs in $log)"
exit $status
