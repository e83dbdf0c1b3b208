#!/bin/sh
# The scaling suite end to end on 1 and 2 ranks, 2 steps of a 2-layer tiny model: the
# CSV has a row per world size with numbers in it, the report prints both with their
# efficiency, and the performance model calibrates against the CSV.
set -u
src=$SHLM_SRCDIR
out=$(mktemp -d "${TMPDIR:-/tmp}/scaling_smoke.XXXXXX") || exit 99
trap 'rm -rf "$out"' EXIT
. "$src/tests/lib.sh"
skip_unless_launcher

"$SHLM" data prepare --tokenizer bytes "$src/jobs/data/shakespeare-val.txt" "$out/train.bin" >/dev/null || exit 99
set -- --ranks 1,2 --steps 2 --warmup 1 --threads 1 --shardlm "$SHLM" --out "$out/run" \
    "$src/jobs/tiny.ini" --set "data.train=$out/train.bin" --set model.n_layers=2 \
    --set train.seq_len=64 --set train.micro_batch=2 --set train.global_batch=4
echo "+ sh $src/benchmarks/strong_scaling.sh $*"
sh "$src/benchmarks/strong_scaling.sh" "$@"
rc=$?
csv=$out/run/scaling.csv
[ -f "$csv" ] && cat "$csv"
fail=0
[ $rc -eq 0 ] || { echo "FAIL: strong_scaling.sh exited $rc" >&2; fail=1; }
# header names the columns; one row per world size, positive numbers where numbers go
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { n++; ws[$c["world_size"]] = 1
      for (k in want) if (!($c[k] + 0 > 0)) { print "FAIL: row " NR ": " k " = " $c[k]; bad = 1 }
      # MFU is n/a on the cpu backend (no device peak): metrics.jsonl has null, the CSV nan
      if ($c["backend"] == "cpu" ? $c["mfu"] != "nan" : !($c["mfu"] + 0 > 0)) { print "FAIL: row " NR ": mfu = " $c["mfu"] " on " $c["backend"]; bad = 1 }
      if ($c["comm_exposed_ms"] == "" || $c["strategy"] != "FULL_SHARD") { print "FAIL: row " NR ": strategy/comm"; bad = 1 } }
    BEGIN { split("tokens_per_s tokens_per_s_per_gpu step_ms mem_peak_bytes global_batch", w, " ")
            for (i in w) want[w[i]] = 1 }
    END { if (n != 2 || !(1 in ws) || !(2 in ws)) { print "FAIL: want rows for 1 and 2 ranks, got " n; bad = 1 }
          exit bad }' "$csv" >&2 || fail=1
# global batch fixed: 4 sequences at both sizes
[ "$(awk -F, 'NR > 1 { print $10 }' "$csv" | sort -u)" = 4 ] || { echo "FAIL: global batch not fixed at 4" >&2; fail=1; }
report=$(sh "$src/benchmarks/report.sh" "$csv") || { echo "FAIL: report.sh failed" >&2; fail=1; }
echo "$report"
echo "$report" | awk '$1 == 1 && $10 == "100.0" { one = 1 } $1 == 2 && $10 + 0 > 0 { two = 1 }
    END { exit !(one && two) }' || { echo "FAIL: report rows or efficiency missing" >&2; fail=1; }
model=$("$SHLM_BUILDDIR/benchmarks/perf_model" --calibrate "$csv" --ops "$src/benchmarks/results/perf_model-cpu-ops.txt" \
    --intra-gbs 5 --inter-gbs 5) || { echo "FAIL: perf_model --calibrate failed" >&2; fail=1; }
echo "$model"
echo "$model" | grep -Eq '^ *2 +FULL_SHARD .* [-+][0-9.]+ ' || { echo "FAIL: no model row for 2 ranks" >&2; fail=1; }
[ $fail -eq 0 ] && echo "scaling_smoke: OK"
exit $fail
