#!/bin/sh
# benchmarks/bench_comm on 2 ranks at small sizes, both call styles: every result must
# check out (#wrong 0, exit 0), and a spoiled result must be counted and fail the run.
set -u
bench=$SHLM_BUILDDIR/benchmarks/bench_comm
mpi="sh $SHLM_SRCDIR/tests/mpi_test.sh"
out=$(mktemp -d "${TMPDIR:-/tmp}/comm_bench.XXXXXX") || exit 99
trap 'rm -rf "$out"' EXIT

$mpi 2 "$bench" -b 4K -e 256K -f 8 -n 3 -w 1 --json "$out/blocking.json" >"$out/blocking.txt" 2>&1
rc=$?
cat "$out/blocking.txt"
[ $rc -eq 77 ] && exit 77
fail=0
check_ok() { # NAME RC FILE
    if [ "$2" -ne 0 ]; then echo "FAIL: $1: bench_comm exited $2" >&2; fail=1; fi
    # every data row: op type size count, then time algbw busbw #wrong twice
    rows=$(awk '$1 ~ /^(all_gather|reduce_scatter|all_reduce)$/' "$3" | wc -l)
    bad=$(awk '$1 ~ /^(all_gather|reduce_scatter|all_reduce)$/ && ($8 != 0 || $12 != 0)' "$3" | wc -l)
    # 3 ops x 2 dtypes x 3 sizes (4K, 32K, 256K)
    if [ "$rows" -ne 18 ] || [ "$bad" -ne 0 ]; then
        echo "FAIL: $1: $rows rows (want 18), $bad with #wrong != 0" >&2
        fail=1
    fi
    grep -q '^# wrong values *: 0 OK' "$3" || { echo "FAIL: $1: no '# wrong values : 0 OK' footer" >&2; fail=1; }
}
check_ok blocking $rc "$out/blocking.txt"
grep -q '"wrong": 0}' "$out/blocking.json" || { echo "FAIL: --json has no total" >&2; fail=1; }

$mpi 2 "$bench" -b 4K -e 256K -f 8 -n 3 -w 1 --nonblocking >"$out/nb.txt" 2>&1
rc=$?
cat "$out/nb.txt"
check_ok non-blocking $rc "$out/nb.txt"

# the check must catch a wrong value: one per row and placement, and exit 1
$mpi 2 "$bench" -b 4K -e 4K -n 1 -w 0 --op all_reduce --dtype fp32 --corrupt >"$out/bad.txt" 2>&1
rc=$?
cat "$out/bad.txt"
if [ $rc -eq 0 ] || ! grep -q '^# wrong values *: 2 FAILED' "$out/bad.txt"; then
    echo "FAIL: --corrupt: exit $rc, want non-zero and '# wrong values : 2 FAILED'" >&2
    fail=1
fi
[ $fail -eq 0 ] && echo "comm_bench: OK"
exit $fail
