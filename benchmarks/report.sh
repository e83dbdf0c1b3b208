#!/bin/sh
# Scaling report from strong_scaling.sh's CSV: a table with the scaling efficiency per
# strategy and, when gnuplot is installed, a PNG of throughput and efficiency vs ranks.
#
#   benchmarks/report.sh [--png FILE] [--gpus-per-node G] [--title TEXT] scaling.csv
# Efficiency, with b the smallest world size measured for the strategy and T the mean
# step time: strong (fixed global batch) T_b·N_b / (N·T_N), which is T1/(N·TN) when b = 1;
# weak (global batch ∝ ranks) T_b / T_N. Needs only sh and awk; the plot needs gnuplot
# (Debian: gnuplot-nox) and is skipped with a note without it.
set -u

die() { echo "report.sh: error: $*" >&2; exit 2; }
png="" gpn="" title=""
while [ $# -gt 0 ]; do
    case $1 in
    --png) png=${2:?}; shift 2 ;;
    --gpus-per-node) gpn=${2:?}; shift 2 ;;
    --title) title=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,/^# weak/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
    esac
done
[ $# -eq 1 ] || die "usage: $0 [--png FILE] [--gpus-per-node G] [--title TEXT] scaling.csv"
csv=$1
[ -r "$csv" ] || die "cannot read $csv"
case ${gpn:-1} in '' | *[!0-9]* | 0) die "--gpus-per-node needs a whole number >= 1" ;; esac

# One awk pass: rows in file order, the baseline per strategy, the table, and (with
# DATA set) a whitespace table for gnuplot: strategy N x tokens/s ideal efficiency.
table() {
    awk -F, -v data="${1:-}" -v gpn="${gpn:-0}" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
        n = $col["world_size"]; s = $col["strategy"]; t = $col["step_ms"]
        if (n == "" || t == "") next
        k++; N[k] = n; S[k] = s; T[k] = t; row[k] = $0
        if (!(s in bn) || n + 0 < bn[s] + 0) { bn[s] = n; bt[s] = t; bx[s] = $col["tokens_per_s"] }
        mode = ("mode" in col) ? $col["mode"] : "strong"
        gb = ("global_batch" in col) ? $col["global_batch"] : "?"
        seq = ("seq_len" in col) ? $col["seq_len"] : "?"
    }
    END {
        if (k == 0) { print "report.sh: no rows in the CSV" > "/dev/stderr"; exit 1 }
        if (mode == "weak")
            printf "# mode weak: global batch grows with the ranks (%s sequences x %s tokens at the largest); efficiency = T_b / T_N\n", gb, seq
        else
            printf "# mode strong: global batch %s sequences x %s tokens at every world size; efficiency = T_b x N_b / (N x T_N)\n", gb, seq
        printf "# T = mean step time after the warm-up, b = the smallest world size of the strategy; spread = slowest - fastest step;\n"
        printf "# runs: repeats of the point (the median run is shown) and their spread, (slowest - fastest) / median\n#\n"
        printf "# %6s %14s %12s %13s %10s %10s %12s %10s %7s %11s %10s\n", "ranks", "strategy", "tokens/s",
            "tokens/s/GPU", "step", "spread", "exposed comm", "peak mem", "MFU", "efficiency", "runs"
        printf "# %6s %14s %12s %13s %10s %10s %12s %10s %7s %11s %10s\n", "(N)", "", "(1/s)", "(1/s)",
            "(ms)", "(ms)", "(ms)", "(MiB)", "(%)", "(%)", "(n, %)"
        for (i = 1; i <= k; i++) {
            split(row[i], f, ",")
            s = S[i]; n = N[i]; t = T[i]
            eff = (mode == "weak") ? bt[s] / t : bt[s] * bn[s] / (n * t)
            spread = ("step_ms_max" in col) ? f[col["step_ms_max"]] - f[col["step_ms_min"]] : 0
            runs = ("repeats" in col) ? sprintf("%d, %.1f", f[col["repeats"]], f[col["repeat_spread_pct"]]) : "1"
            printf "  %6d %14s %12.1f %13.1f %10.2f %10.2f %12.2f %10.1f %7.3f %11.1f %10s\n", n, s,
                f[col["tokens_per_s"]], f[col["tokens_per_s_per_gpu"]], t, spread,
                f[col["comm_exposed_ms"]], f[col["mem_peak_bytes"]] / 1048576, 100 * f[col["mfu"]],
                100 * eff, runs
            if (data != "") {
                x = gpn > 0 ? n / gpn : n
                ideal = bx[s] * n / bn[s] # both modes: throughput in proportion to ranks
                printf "%s %d %g %s %g %g\n", s, n, x, f[col["tokens_per_s"]], ideal, 100 * eff > data
            }
        }
        for (s in bn) if (bn[s] != 1)
            printf "# note: %s has no 1-rank run; its efficiency is relative to %d ranks\n", s, bn[s]
    }' "$csv"
}

echo "# shardlm scaling report: $csv"
if [ -z "$png" ]; then
    table
    exit $?
fi
if ! command -v gnuplot >/dev/null 2>&1; then
    table
    rc=$?
    echo "# no plot: gnuplot is not installed (Debian: apt-get install gnuplot-nox)"
    exit $rc
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/report.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT
table "$tmp/points" || exit 1
xlabel="ranks (N)"
[ -n "$gpn" ] && xlabel="nodes of $gpn ranks"
[ -n "$title" ] || title=$(basename "$(dirname "$csv")")
# one data block per strategy, so each gets its own line and colour
strats=$(awk '{print $1}' "$tmp/points" | awk '!seen[$0]++')
: >"$tmp/blocks"
plot_x="" plot_e="" i=0
for s in $strats; do
    awk -v s="$s" '$1 == s {print $3, $4, $5, $6}' "$tmp/points" >>"$tmp/blocks"
    printf '\n\n' >>"$tmp/blocks"
    # one colour per strategy in both panels; the ideal (linear from each strategy's
    # smallest run) in grey, titled once: the strategies' lines nearly coincide
    c=$((i + 1))
    t="notitle"
    [ $i -eq 0 ] && t="title 'ideal'"
    plot_x="$plot_x '$tmp/blocks' index $i using 1:3 with lines lw 1 lc rgb 'gray50' $t,"
    plot_x="$plot_x '$tmp/blocks' index $i using 1:2 with linespoints lw 2 pt 7 lc $c title '$s',"
    plot_e="$plot_e '$tmp/blocks' index $i using 1:4 with linespoints lw 2 pt 7 lc $c title '$s',"
    i=$((i + 1))
done
xtics=$(awk '{print $3}' "$tmp/points" | sort -n | uniq | tr '\n' ',' | sed 's/,$//')
term=png
gnuplot -e 'set terminal' 2>/dev/null | grep -q pngcairo && term=pngcairo
gnuplot <<EOF || die "gnuplot failed"
set terminal $term size 960,400 font ",10"
set termoption noenhanced
set output '$png'
set multiplot layout 1,2 title "$title"
set logscale x 2
set xtics ($xtics)
set grid
set key top left
set xlabel "$xlabel"
set ylabel "tokens/s (whole job)"
set logscale y 2
set title "throughput"
plot ${plot_x%,}
set ylabel "scaling efficiency (%)"
set title "efficiency"
unset logscale y
set yrange [0:110]
set key bottom left
plot 100 with lines lw 1 lc rgb 'gray50' title 'ideal', ${plot_e%,}
unset multiplot
EOF
echo "# plot: $png"
