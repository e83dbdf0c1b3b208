#!/usr/bin/env bash
# FP8 loss parity: the SmolLM2-135M shape trained from the seed (benchmarks/fp8/smollm2-135m.ini)
# on real text (benchmarks/fp8/SOURCE.md) once per matmul recipe (train.matmul), same seed,
# data and schedule, validated every --eval-every steps; then a table: each recipe's final
# validation loss, its difference to bf16's relative to bf16's, and its mean step time.
# With --seeds, every recipe runs at every seed (train.seed: the initialisation and the data
# order) and each FP8 run is compared with bf16's at its own seed; the verdict is the mean
# of those paired differences, and the table also gives bf16's own spread across the seeds
# (one seed's difference is within that spread's noise; see benchmarks/RESULTS.md).
#
#   bash benchmarks/fp8/parity.sh [options] [RECIPE...]
#
# RECIPE: bf16, fp8-tensorwise, fp8-rowwise (default: all three, bf16 first), an FP8 one
# optionally with "+fast_accum" or "+fp32_accum" (train.fp8_fast_accum = true or false;
# without either the job's default), e.g. fp8-tensorwise+fp32_accum.
# bf16 runs with the key unset (its default), so it runs on a build that lacks the key.
# Options:
#   --steps N         optimizer steps of every run (default 2000), the first 5% warm-up
#   --eval-every N    steps between validation passes (default 100)
#   --data DIR        DIR/train.bin and DIR/val.bin (default $SHLM_CACHE/fp8data, which
#                     benchmarks/fp8/prepare_corpus.sh makes; on the GPU machine .gpu/fp8data)
#   --out DIR         results (default /tmp/shlm-fp8-parity): DIR/RECIPE/ is each run's
#                     run dir (metrics.jsonl: the curves), DIR/RECIPE.log its output,
#                     DIR/parity.jsonl a row per recipe, DIR/val_loss.csv the validation
#                     curves side by side, DIR/plots/ shardlm plot's PNGs (needs gnuplot);
#                     with --seeds those of seed S under DIR/seed-S/, DIR/parity.jsonl a row
#                     per recipe and seed, DIR/val_loss.csv every seed's curves (columns
#                     RECIPE@SEED) and DIR/val_loss.png them plotted (gnuplot)
#   --ranks N         ranks of every run (default 1), through tests/mpi_test.sh
#   --tolerance PCT   the largest |relative difference| to bf16 that passes (default 1);
#                     with --seeds, the largest |mean paired difference|
#   --seeds LIST      comma-separated train.seed values (e.g. 1337,2,3): every recipe at
#                     every seed, DIR/seed-S/RECIPE/ each run dir (default: the job's seed,
#                     one run per recipe, DIR/RECIPE/)
#   --cpu             runtime.backend = cpu (a smoke test: shrink the shape and the steps
#                     with --set, e.g. --set model.n_layers=2 --set train.seq_len=64)
#   --set KEY=VALUE   passed to every run after the script's own keys (repeatable)
#   --dry-run         print the commands, run none
#   --report          run nothing: the table and plots from the run dirs already in --out
#                     (e.g. runs made on a GPU machine without gnuplot, copied here)
# Environment: SHLM (default $SHLM_BIN/shardlm, else the tree's shardlm), SHLM_CACHE
# (default ~/.cache/shardlm), PYTHON (a python3 for the table; the standard library only).
# Exit status: 0 when every run finished and every FP8 recipe is within the tolerance of
# bf16; 1 otherwise (the table says which); 2 bad usage.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
die() { echo "parity: error: $*" >&2; exit 2; }
SHLM_CACHE=${SHLM_CACHE:-${HOME:-/root}/.cache/shardlm}
PY=${PYTHON:-python3}

steps=2000 eval_every=100 data=$SHLM_CACHE/fp8data out=/tmp/shlm-fp8-parity ranks=1 tol=1
cpu=0 dry=0 report=0 recipes=() seeds=""
extra=()
while [ $# -gt 0 ]; do
    case $1 in
    --steps) steps=${2:?--steps needs N}; shift 2 ;;
    --eval-every) eval_every=${2:?--eval-every needs N}; shift 2 ;;
    --data) data=${2:?--data needs DIR}; shift 2 ;;
    --out) out=${2:?--out needs DIR}; shift 2 ;;
    --ranks) ranks=${2:?--ranks needs N}; shift 2 ;;
    --tolerance) tol=${2:?--tolerance needs PCT}; shift 2 ;;
    --seeds) seeds=${2:?--seeds needs LIST}; shift 2 ;;
    --cpu) cpu=1; shift ;;
    --set) extra+=(--set "${2:?--set needs KEY=VALUE}"); shift 2 ;;
    --dry-run) dry=1; shift ;;
    --report) report=1; shift ;;
    -h | --help) sed -n '2,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    bf16 | fp8-tensorwise | fp8-rowwise) recipes+=("$1"); shift ;;
    fp8-tensorwise+fast_accum | fp8-tensorwise+fp32_accum | fp8-rowwise+fast_accum | fp8-rowwise+fp32_accum)
        recipes+=("$1"); shift ;;
    *) die "unknown recipe '$1' (bf16, fp8-tensorwise, fp8-rowwise, FP8 ones with +fast_accum or +fp32_accum)" ;;
    esac
done
[ ${#recipes[@]} -gt 0 ] || recipes=(bf16 fp8-tensorwise fp8-rowwise)
for n in "$steps" "$eval_every" "$ranks"; do
    case $n in '' | *[!0-9]* | 0) die "not a whole number >= 1: '$n'" ;; esac
done
case $tol in '' | *[!0-9.]* | *.*.*) die "--tolerance: not a percentage: '$tol'" ;; esac
seen=" "
for r in "${recipes[@]}"; do
    case $seen in *" $r "*) die "recipe $r given twice" ;; esac
    seen="$seen$r "
done
seed_list=()
if [ -n "$seeds" ]; then
    IFS=, read -r -a seed_list <<< "$seeds"
    seen=" "
    for n in "${seed_list[@]}"; do
        case $n in '' | *[!0-9]*) die "--seeds: not a whole number: '$n' in '$seeds'" ;; esac
        case $seen in *" $n "*) die "--seeds: seed $n given twice" ;; esac
        seen="$seen$n "
    done
fi
if [ -z "${SHLM:-}" ]; then
    SHLM=$src/shardlm
    [ -n "${SHLM_BIN:-}" ] && SHLM=$SHLM_BIN/shardlm
fi
[ "$report" = 0 ] || [ -d "$out" ] || die "--report: no directory $out"
if [ "$dry" = 0 ]; then
    [ -x "$SHLM" ] || die "no shardlm at $SHLM (set SHLM or SHLM_BIN)"
    [ "$report" = 1 ] || for f in train.bin val.bin; do
        [ -f "$data/$f" ] || die "no $data/$f (benchmarks/fp8/prepare_corpus.sh --out $data makes it)"
    done
    mkdir -p "$out" || die "cannot create $out"
    "$PY" -c 'import json' 2> /dev/null || die "no $PY to make the table (set PYTHON)"
fi
case $out in /*) ;; *) out=$PWD/$out ;; esac
case $data in /*) ;; *) data=$PWD/$data ;; esac

# one seed's runs, recipe after recipe, into DIR (SEED empty: the job's own seed)
run_recipes() { # DIR SEED
    local dir=$1 seed=$2 r rc t0 sets
    local seed_set=()
    [ -n "$seed" ] && seed_set=(--set train.seed="$seed")
    for r in "${recipes[@]}"; do
        sets=(--set data.train="$data/train.bin" --set data.val="$data/val.bin"
            --set train.steps="$steps" --set train.warmup_steps=$((steps / 20))
            --set train.eval_every="$eval_every"
            --set log.run_dir="$dir/$r" --set checkpoint.dir=)
        case $r in bf16) ;; *) sets+=(--set train.matmul="${r%+*}") ;; esac
        case $r in *+fast_accum) sets+=(--set train.fp8_fast_accum=true) ;; esac
        case $r in *+fp32_accum) sets+=(--set train.fp8_fast_accum=false) ;; esac
        [ "$cpu" = 1 ] && sets+=(--set runtime.backend=cpu)
        sets+=("${seed_set[@]}")
        echo "+ sh $src/tests/mpi_test.sh $ranks $SHLM train $here/smollm2-135m.ini ${sets[*]} ${extra[*]}"
        [ "$dry" = 1 ] && continue
        mkdir -p "$dir" || return 1
        rm -rf "${dir:?}/$r"
        t0=$SECONDS
        sh "$src/tests/mpi_test.sh" "$ranks" "$SHLM" train "$here/smollm2-135m.ini" "${sets[@]}" \
            "${extra[@]}" > "$dir/$r.log" 2>&1
        rc=$?
        echo "  ${seed:+seed $seed }$r: exit status $rc, $((SECONDS - t0)) s; log $dir/$r.log"
    done
}

if [ "$report" = 0 ]; then
    if [ ${#seed_list[@]} = 0 ]; then
        run_recipes "$out" ""
    else
        for n in "${seed_list[@]}"; do run_recipes "$out/seed-$n" "$n"; done
    fi
fi
[ "$dry" = 1 ] && exit 0

# the table: the standard library only (the GPU machine's python3 has no numpy to spare)
failed=0
"$PY" - "$out" "$tol" "$steps" "$seeds" "${recipes[@]}" <<'EOF' || failed=1
import json, os, sys
out, tol, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
seeds, recipes = [s for s in sys.argv[4].split(",") if s], sys.argv[5:]

def last_error(log):
    try:
        lines = [l.strip() for l in open(log, errors="replace") if l.strip()]
    except OSError:
        return "no log"
    errs = [l for l in lines if "error" in l.lower()]
    return (errs or lines or ["empty log"])[-1]

def read_rows(d, seed):
    """one row per recipe from the run dirs under d, each compared with d's bf16 run"""
    rows = []
    for r in recipes:
        row = dict(recipe=r, status="failed")
        if seed is not None:
            row["seed"] = int(seed)
        try:
            steps_ = [json.loads(l) for l in open(os.path.join(d, r, "metrics.jsonl")) if l.strip()]
        except (OSError, ValueError):
            steps_ = []
        run_ids = {s.get("run_id") for s in steps_}
        vals = [(s["step"], s["val_loss"]) for s in steps_ if s.get("val_loss") is not None]
        if steps_ and steps_[-1]["step"] == steps and vals and vals[-1][0] == steps and len(run_ids) == 1:
            # the step time: steps without a validation pass, after the first tenth (at most 10
            # steps: cuBLASLt plans and the allocator's first steps); all steps when none is left
            skip = min(10, steps // 10)
            timed = [s for s in steps_ if s["step"] > skip and s.get("val_loss") is None] or steps_
            ms = sum(s["step_ms"] for s in timed) / len(timed)
            tps = sum(s["tokens_per_s_per_gpu"] for s in timed) / len(timed)
            row.update(status="ok", val_loss=vals[-1][1], train_loss=steps_[-1]["loss"], step_ms=ms,
                       tokens_per_s_per_gpu=tps, steps_timed=len(timed), val_curve=vals,
                       mem_peak_gib=max(s["mem_peak_bytes"] for s in steps_) / 2**30)
        else:
            row["why"] = last_error(os.path.join(d, r + ".log"))
        rows.append(row)
    base = next((x for x in rows if x["recipe"] == "bf16" and x["status"] == "ok"), None)
    for x in rows:
        if x["status"] == "ok" and base and x is not base:
            x["rel_diff_pct"] = 100.0 * (x["val_loss"] - base["val_loss"]) / base["val_loss"]
            x["within_tolerance"] = abs(x["rel_diff_pct"]) <= tol
            x["step_ms_vs_bf16"] = x["step_ms"] / base["step_ms"]
    # the validation curves side by side: step, then each recipe's loss ('' where it has none)
    curves = {x["recipe"]: dict(x.get("val_curve", [])) for x in rows}
    all_steps = sorted({s for c in curves.values() for s in c})
    with open(os.path.join(d, "val_loss.csv"), "w") as f:
        f.write(",".join(["step"] + recipes) + "\n")
        for s in all_steps:
            f.write(",".join([str(s)] + [f"{curves[r][s]:.6f}" if s in curves[r] else "" for r in recipes]) + "\n")
    return rows

def num(x, k, spec, w):
    """x[k] formatted as {:SPEC} right-aligned in W columns, '-' where it is not a number"""
    v = x.get(k)
    return f"{v:{spec}}".rjust(w) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-".rjust(w)

def print_table(rows, seed):
    print(f"# fp8 parity{'' if seed is None else ', seed ' + seed}: {steps} steps; relative difference "
          f"= (val - bf16's) / bf16's; within: |difference| <= {tol:g}%; step time: mean of the steps "
          f"without validation after the first {min(10, steps // 10)}")
    print(f"#  {'recipe':25s} {'val_loss':>9s} {'train_loss':>10s} {'rel_diff%':>9s} {'within':>6s} "
          f"{'ms/step':>9s} {'x_bf16':>6s} {'tok/s/GPU':>10s} {'mem_GiB':>7s}  notes")
    for x in rows:
        within = {True: "yes", False: "NO"}.get(x.get("within_tolerance"), "-")
        note = "" if x["status"] == "ok" else f"FAILED: {x.get('why', '')}"
        print(f"   {x['recipe']:25s} {num(x, 'val_loss', '.4f', 9)} {num(x, 'train_loss', '.4f', 10)} "
              f"{num(x, 'rel_diff_pct', '+.3f', 9)} {within:>6s} {num(x, 'step_ms', '.2f', 9)} "
              f"{num(x, 'step_ms_vs_bf16', '.3f', 6)} {num(x, 'tokens_per_s_per_gpu', ',.0f', 10)} "
              f"{num(x, 'mem_peak_gib', '.2f', 7)}  {note}")

bad = 0
if not seeds:
    rows = read_rows(out, None)
    print_table(rows, None)
    bad = sum(x["status"] != "ok" or x.get("within_tolerance") is False for x in rows)
else:
    rows = []
    for s in seeds:
        seed_rows = read_rows(os.path.join(out, f"seed-{s}"), s)
        print_table(seed_rows, s)
        rows += seed_rows
    bad = sum(x["status"] != "ok" for x in rows)
    # over the seeds: each FP8 recipe's mean paired difference decides; bf16's spread is the
    # noise one seed's comparison carries
    print(f"# over seeds {','.join(seeds)}: mean_rel_diff% = the mean of each seed's difference to "
          f"that seed's bf16; within: |mean| <= {tol:g}%; spread% = (max - min) / mean of the "
          f"recipe's own final validation losses")
    print(f"#  {'recipe':28s} {'mean_val':>9s} {'spread%':>8s} {'mean_rel_diff%':>14s} {'min%':>7s} "
          f"{'max%':>7s} {'within':>6s}")
    summary = []
    for r in recipes:
        ok = [x for x in rows if x["recipe"] == r and x["status"] == "ok"]
        vals = [x["val_loss"] for x in ok]
        diffs = [x["rel_diff_pct"] for x in ok if "rel_diff_pct" in x]
        row = dict(recipe=r, summary=True, seeds=len(ok))
        if len(ok) == len(seeds):
            mean = sum(vals) / len(vals)
            row.update(mean_val_loss=mean, spread_pct=100.0 * (max(vals) - min(vals)) / mean)
            if r != "bf16" and len(diffs) == len(seeds):
                m = sum(diffs) / len(diffs)
                row.update(mean_rel_diff_pct=m, min_rel_diff_pct=min(diffs),
                           max_rel_diff_pct=max(diffs), within_tolerance=abs(m) <= tol)
                bad += abs(m) > tol
        within = {True: "yes", False: "NO"}.get(row.get("within_tolerance"), "-")
        print(f"   {r:28s} {num(row, 'mean_val_loss', '.4f', 9)} {num(row, 'spread_pct', '.3f', 8)} "
              f"{num(row, 'mean_rel_diff_pct', '+.3f', 14)} {num(row, 'min_rel_diff_pct', '+.3f', 7)} "
              f"{num(row, 'max_rel_diff_pct', '+.3f', 7)} {within:>6s}"
              + ("" if row["seeds"] == len(seeds) else f"  FAILED: {len(seeds) - row['seeds']} seed(s)"))
        summary.append(row)
    rows += summary
    # every seed's validation curves side by side: step, then RECIPE@SEED
    cols = [(x["recipe"], x["seed"], dict(x["val_curve"])) for x in rows
            if not x.get("summary") and x["status"] == "ok"]
    all_steps = sorted({s for _, _, c in cols for s in c})
    with open(os.path.join(out, "val_loss.csv"), "w") as f:
        f.write(",".join(["step"] + [f"{r}@{sd}" for r, sd, _ in cols]) + "\n")
        for s in all_steps:
            f.write(",".join([str(s)] + [f"{c[s]:.6f}" if s in c else "" for _, _, c in cols]) + "\n")
with open(os.path.join(out, "parity.jsonl"), "w") as f:
    for x in rows:
        f.write(json.dumps(x) + "\n")
sys.exit(1 if bad else 0)
EOF

# the curves as PNGs, where gnuplot is (shardlm plot's dependency): one set per seed
plot_dir() { # DIR
    local done_runs=() r
    for r in "${recipes[@]}"; do [ -s "$1/$r/metrics.jsonl" ] && done_runs+=("$1/$r"); done
    [ ${#done_runs[@]} -gt 0 ] || return 0
    if command -v gnuplot > /dev/null; then
        "$SHLM" plot --out "$1/plots" "${done_runs[@]}" > "$1/plot.log" 2>&1 &&
            echo "# plots: $1/plots/loss.png (training and validation loss of every recipe)" ||
            echo "# plots: shardlm plot failed: $(tail -n 1 "$1/plot.log")"
    else
        echo "# plots: no gnuplot here; elsewhere: shardlm plot --out DIR ${done_runs[*]}"
    fi
}
if [ ${#seed_list[@]} = 0 ]; then
    plot_dir "$out"
else
    for n in "${seed_list[@]}"; do plot_dir "$out/seed-$n"; done
    # every seed's validation curves in one figure: a colour per recipe, a dash per seed
    if command -v gnuplot > /dev/null && [ -s "$out/val_loss.csv" ]; then
        ncol=$(head -n 1 "$out/val_loss.csv" | awk -F, '{ print NF }')
        {
            echo "set terminal pngcairo noenhanced size 1200,650; set output '$out/val_loss.png'"
            echo "set datafile separator ','; set key outside right; set grid"
            echo "set xrange [$((steps / 5)):*]  # the first fifth: every curve falls steeply alike"
            echo "set title 'validation loss, $steps steps, seeds $seeds'; set xlabel 'step'; set ylabel 'validation loss'"
            printf 'plot'
            head -n 1 "$out/val_loss.csv" | tr ',' '\n' | awk -v n="$ncol" -v rs="${recipes[*]}" -v ss="$seeds" '
                BEGIN { nr = split(rs, R, " "); ns = split(ss, S, ",") }
                NR > 1 { split($0, p, "@"); for (i = 1; i <= nr; i++) if (R[i] == p[1]) c = i
                         for (i = 1; i <= ns; i++) if (S[i] == p[2]) d = i
                         printf "%s '\''%s'\'' using 1:%d with lines lw 2 lc %d dt %d title '\''%s, seed %s'\''",
                             (NR > 2 ? "," : ""), f, NR, c, d, p[1], p[2] }' f="$out/val_loss.csv"
            echo
        } > "$out/val_loss.gp"
        gnuplot "$out/val_loss.gp" > "$out/plot.log" 2>&1 && echo "# plot: $out/val_loss.png (every seed's validation loss)" ||
            echo "# plot: gnuplot failed: $(tail -n 1 "$out/plot.log")"
    fi
fi
exit $failed
