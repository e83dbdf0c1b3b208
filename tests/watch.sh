#!/bin/sh
# What a person watching a CPU run sees, and the log.* settings that cannot work:
#  1. the step line shows step/total, elapsed and ETA; the start-up breakdown and the
#     closing summary are printed; summary.json is written; every metrics.jsonl row has
#     a UTC time, the run id and the job hash, and the straggler's rank and host;
#  2. a second run into the same run_dir says it appends after the earlier run's rows, and
#     its rows carry another run id;
#  3. MFU: n/a (null) on the cpu backend; against log.peak_tflops when set; against the
#     device table for a device it knows (SHLM_TEST_DEVICE=NAME:MAJOR.MINOR pretends
#     one); one warning line and null for a device it does not know;
#  4. a port in use, a port out of range or no address before ':' (at the job's loading,
#     naming where it was set), a telemetry interval under 10 ms, an unknown host, a
#     textfile directory that is
#     a file, is missing, or is read-only (a tmpfs mounted ro; skipped where mounting is
#     not allowed, and the test with it): one error line on 2 ranks, exit 1, no step trained.
#   SHLM=./shardlm SHLM_SRCDIR=. sh tests/watch.sh
set -u
. "$SHLM_SRCDIR/tests/lib.sh"
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
test_begin watch.sh shlm_watch
holder="" mounted=""
cleanup() {
    [ -n "$holder" ] && kill "$holder" 2>/dev/null
    [ -n "$mounted" ] && umount "$work/ro" 2>/dev/null
}
trap cleanup EXIT
prepare_corpus "$work/train.bin"
cp "$SHLM_SRCDIR/tests/jobs/small.ini" "$work/w.ini"

# run NAME NP [--set ...]: trains the small job (6 steps) in $work/NAME, output in
# $work/NAME.out, .err; sets $rc
run() {
    rn=$1 np=$2
    shift 2
    set -- "$SHLM" train "$work/w.ini" --set "data.train=$work/train.bin" --set train.steps=6 \
        --set "log.run_dir=$work/${RUN_DIR:-$rn}" "$@"
    echo "+ sh $mpi $np $*"
    sh "$mpi" "$np" "$@" >"$work/$rn.out" 2>"$work/$rn.err" </dev/null
    rc=$?
    skip_without_launcher $rc
}
# refused NAME PATTERN...: the run NAME was refused before step 1 (refused_on_ranks)
refused() {
    rf=$1
    shift
    refused_on_ranks "$rf" $rc "$@"
}
# field FILE STEP KEY: KEY's value (as written) in FILE's row of STEP
field() {
    sed -n "s/.*\"step\": $2, .*\"$3\": \([^,}]*\)[,}].*/\1/p" "$1" | head -n 1
}

# 1. the line, the start-up, the summary, the rows
run a 2 --set log.every=2
if [ $rc -ne 0 ]; then
    tail -n 5 "$work/a.err"
    fail "a: exit $rc"
fi
grep -q '^ *step/total |.*| *elapsed | *ETA$' "$work/a.out" || fail "a: no step/total, elapsed, ETA header"
grep -Eq '^ +4/6 \|.*\| +[0-9]+:[0-9]{2}:[0-9]{2} \| +[0-9]+:[0-9]{2}:[0-9]{2}$' "$work/a.out" ||
    fail "a: no line '4/6 | ... | elapsed | ETA'"
grep -q '^start-up: [0-9.]* s to the end of the first step: .*weights (init from the seed, [0-9]* values drawn)' \
    "$work/a.out" || fail "a: no start-up breakdown"
grep -q '^summary: run [0-9TZ]*-[0-9a-f]*: 6 step(s) (1..6)' "$work/a.out" || fail "a: no summary"
grep -q '^summary: step time mean .* median .*; exposed comm .*; peak memory' "$work/a.out" ||
    fail "a: no step-time line in the summary"
grep -q '"stalls": [0-9]*, ' "$work/a/summary.json" 2>/dev/null || fail "a: no summary.json"
[ "$(wc -l <"$work/a/metrics.jsonl")" -eq 3 ] || fail "a: want 3 rows (log.every = 2)"
row=$(sed -n 2p "$work/a/metrics.jsonl")
for k in '"time": "20[0-9-]*T[0-9:.]*Z"' '"run_id": "[0-9]*T[0-9]*Z-[0-9a-f]\{8\}"' \
    '"job_hash": "[0-9a-f]\{16\}"' '"steps": 6' '"eta_s": [0-9.]*' '"tokens_to_go": [0-9]*' \
    '"slowest_rank": [01]' "\"slowest_host\": \"$(hostname)\"" '"fastest_rank": [01]' \
    '"tokens_per_s_per_gpu": [0-9.]*' '"mfu": null'; do
    printf '%s\n' "$row" | grep -q "$k" || fail "a: row 2 has no $k: $row"
done
[ "$(field "$work/a/metrics.jsonl" 6 tokens_to_go)" = 0 ] || fail "a: tokens_to_go at the last step"

# 2. a second run into the same directory
RUN_DIR=a run a2 1
grep -q "^metrics: .*/a/metrics.jsonl: appending run .* after 3 row(s) of 1 earlier run(s)" \
    "$work/a2.out" || fail "a2: no notice of the earlier run's rows"
ids=$(sed 's/.*"run_id": "\([^"]*\)".*/\1/' "$work/a/metrics.jsonl" | sort -u | wc -l)
[ "$ids" -eq 2 ] || fail "a2: want 2 run ids in the file, got $ids"

# 3. MFU
tf=$(field "$work/a/metrics.jsonl" 6 tflops_per_gpu)
check_mfu() { # NAME PEAK: the row of step 6 has mfu = tflops_per_gpu / PEAK
    got=$(field "$work/$1/metrics.jsonl" 6 mfu)
    t=$(field "$work/$1/metrics.jsonl" 6 tflops_per_gpu)
    # both are printed with 6 decimals: allow their rounding
    awk -v g="$got" -v t="$t" -v p="$2" 'BEGIN { d = g - t / p; if (d < 0) d = -d
        exit !(g != "null" && d <= 1.01 * (5e-7 / p + 5e-7)) }' ||
        fail "$1: mfu $got, want $t / $2"
}
run peak 1 --set log.peak_tflops=0.001
check_mfu peak 0.001
SHLM_TEST_DEVICE="NVIDIA H200:9.0" run h200 1
check_mfu h200 989
grep -q "^MFU: 989 TFLOP/s, the dense bf16 peak of NVIDIA H200 (h200)" "$work/h200.out" ||
    fail "h200: no MFU line naming the peak"
SHLM_TEST_DEVICE="NVIDIA Imaginary X1:9.0" run unknown 2
if [ $rc -ne 0 ] || [ "$(grep -c . "$work/unknown.err")" -ne 1 ] ||
    ! grep -q "^shardlm: warning: MFU n/a: .*'NVIDIA Imaginary X1' (compute capability 9.0); set log.peak_tflops" "$work/unknown.err"; then
    sed 's/^/    stderr: /' "$work/unknown.err"
    fail "unknown: want exit 0 and one warning line, got exit $rc"
fi
[ "$(field "$work/unknown/metrics.jsonl" 6 mfu)" = null ] || fail "unknown: mfu is not null"
[ -n "$tf" ] || fail "a: no tflops_per_gpu"

# 4. settings that cannot work: refused before step 1
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null)
if [ -n "$port" ]; then
    python3 -c "
import socket, time
s = socket.socket(); s.bind(('127.0.0.1', $port)); s.listen(1); time.sleep(60)" &
    holder=$!
    sleep 1
    run busy 2 --set "log.prometheus=127.0.0.1:$port"
    refused busy "log.prometheus = 127.0.0.1:$port" "Address already in use"
    kill "$holder" 2>/dev/null
    holder=""
fi
run badport 2 --set log.prometheus=70000
refused badport "--set log.prometheus: [log] prometheus = 70000" "0..65535"
run badaddr 2 --set log.prometheus=:9400
refused badaddr "[log] prometheus = :9400" "no address before ':'"
run interval 2 --set log.telemetry_interval_ms=5
refused interval "[log] telemetry_interval_ms = 5" "at least 10"
run badhost 2 --set log.prometheus=no-such-host.invalid:9400
refused badhost "log.prometheus = no-such-host.invalid:9400"
: >"$work/a-file"
run tffile 2 --set "log.prometheus_textfile=$work/a-file"
refused tffile "log.prometheus_textfile = $work/a-file"
run tfmissing 2 --set "log.prometheus_textfile=$work/missing"
refused tfmissing "log.prometheus_textfile = $work/missing" "No such file"
mkdir "$work/ro"
if mount -t tmpfs -o ro,size=1m tmpfs "$work/ro" 2>/dev/null; then
    mounted=1
    run tfro 2 --set "log.prometheus_textfile=$work/ro"
    refused tfro "log.prometheus_textfile = $work/ro" "Read-only file system"
else
    skip_part "a read-only textfile directory: cannot mount a read-only tmpfs here (not root, or not allowed)"
fi
cleanup
trap - EXIT
test_end
