#!/bin/sh
# shardlm's NVML telemetry against nvidia-smi on every visible GPU, both read back to back
# on idle GPUs: the index, temperature (within 3 C), memory used (64 MiB), SM clock (15%
# or 100 MHz), power (15% or 10 W), utilisation (10 points) and the volatile ECC totals
# (equal; N/A alike) must agree, and the window must hold about ten samples (100 ms
# interval over a second); shardlm must report every GPU nvidia-smi lists (none compared is
# a failure). Run by `make check-gpu`; exit 77 where no GPU or no NVML is found.
#   BUILDDIR=. sh tests/gpu/nvml_fields.sh
set -u
B=${BUILDDIR:-.}
command -v nvidia-smi >/dev/null 2>&1 || { echo "nvml_fields: no nvidia-smi: skipped"; exit 77; }
ids=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null)
[ -n "$ids" ] || { echo "nvml_fields: no GPU visible: skipped"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
q=index,temperature.gpu,memory.used,clocks.sm,power.draw,utilization.gpu,utilization.memory,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total
nvidia-smi --query-gpu=$q --format=csv,noheader,nounits >"$T/before"
# shellcheck disable=SC2086
"$B/tests/gpu/nvml_fields" $ids >"$T/ours"
rc=$?
[ $rc -eq 77 ] && { echo "nvml_fields: NVML unavailable: skipped"; exit 77; }
[ $rc -eq 0 ] || exit 1
nvidia-smi --query-gpu=$q --format=csv,noheader,nounits >"$T/after"
echo "nvidia-smi ($q), before and after:"
cat "$T/before" "$T/after"
echo "shardlm (index,util,mem util,sm clock,power,temp,mem used,reasons,ecc corrected,ecc uncorrected,samples):"
cat "$T/ours"
# one line per GPU: ours, then nvidia-smi's before and after
awk -F', *' '
    FILENAME ~ /ours$/ { o[FNR] = $0; n = FNR; next }
    FILENAME ~ /before$/ { b[FNR] = $0; nb = FNR; next }
    { a[FNR] = $0 }
    function near(x, lo, hi, tol) { return x >= lo - tol && x <= hi + tol }
    function lo2(x, y) { return x < y ? x : y }
    function hi2(x, y) { return x > y ? x : y }
    END {
        bad = 0
        n += 0; nb += 0
        if (n == 0 || n != nb) {
            print "FAIL: shardlm reported " n " GPU(s), nvidia-smi lists " nb ": " \
                (n == 0 ? "no GPU compared" : "not every GPU compared")
            bad = 1
        }
        for (i = 1; i <= n; i++) {
            split(o[i], s, ","); split(b[i], p, ", *"); split(a[i], q, ", *")
            # ours: 1 index 2 util 3 memutil 4 sm 5 power 6 temp 7 memused 8 reasons 9 ecc_c 10 ecc_u 11 samples
            # smi:  1 index 2 temp 3 memused 4 sm 5 power 6 util 7 memutil 8 ecc_c 9 ecc_u
            why = ""
            if (s[1] != p[1]) why = why " index " s[1] " vs " p[1]
            if (!near(s[6], lo2(p[2], q[2]), hi2(p[2], q[2]), 3)) why = why " temperature"
            if (!near(s[7], lo2(p[3], q[3]), hi2(p[3], q[3]), 64)) why = why " memory used"
            t = hi2(100, 0.15 * hi2(p[4], q[4]))
            if (!near(s[4], lo2(p[4], q[4]), hi2(p[4], q[4]), t)) why = why " SM clock"
            t = hi2(10, 0.15 * hi2(p[5], q[5]))
            if (!near(s[5], lo2(p[5], q[5]), hi2(p[5], q[5]), t)) why = why " power"
            if (!near(s[2], lo2(p[6], q[6]), hi2(p[6], q[6]), 10)) why = why " utilization"
            if (!near(s[3], lo2(p[7], q[7]), hi2(p[7], q[7]), 10)) why = why " memory utilization"
            if ((s[9] == "N/A") != (p[8] ~ /N\/A|Not Supported/) || (s[9] != "N/A" && s[9] != p[8])) why = why " ECC corrected"
            if ((s[10] == "N/A") != (p[9] ~ /N\/A|Not Supported/) || (s[10] != "N/A" && s[10] != p[9])) why = why " ECC uncorrected"
            if (s[11] < 5 || s[11] > 15) why = why " samples " s[11]
            if (why != "") { print "FAIL: GPU " s[1] ":" why; bad = 1 } else print "PASS: GPU " s[1]
        }
        print "nvml_fields: " n " GPU(s) compared"
        exit bad
    }' "$T/ours" "$T/before" "$T/after"
