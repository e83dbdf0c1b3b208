#!/bin/bash
# The strong-scaling sweep on a cluster: one slurm/strong-scaling.sbatch job per node
# count, all at the same global batch, then one small job (afterany: it runs even when a
# point failed) that merges the points' scaling.csv into one and prints the table and
# draws the PNG with benchmarks/report.sh. The measuring and the report are
# benchmarks/strong_scaling.sh's and report.sh's; this only spreads the points over jobs.
#
#   slurm/strong-scaling-submit.sh [options] JOB.ini [--set section.key=value ...]
#     --nodes LIST           node counts, comma-separated (default 1,2,4,8,16)
#     --gpus-per-node G      GPUs per node (default $SHLM_GPUS_PER_NODE, else 8)
#     --ranks-per-node R     ranks per node (default G; CPU runs: --gpus-per-node 0 --ranks-per-node R)
#     --global-batch B       sequences per step at every point (default: the job's
#                            train.global_batch if the largest point divides it, else
#                            micro_batch x the largest world size)
#     --steps N, --warmup N, --repeat K, --threads N   passed to strong_scaling.sh
#     --out DIR              where the points and the report go, on a file system every
#                            node sees (default results/strong-<job>-<date> here)
#     --sbatch "OPTS"        more sbatch options for every point (--time=01:00:00 ...)
#     --dry-run              print the sbatch commands, submit nothing
#   slurm/strong-scaling-submit.sh --report DIR [--gpus-per-node R]
#                            merge DIR/nodes*/scaling.csv into DIR/scaling.csv, write
#                            DIR/report.txt and DIR/scaling.png (what the last job runs)
# Site values: the variables below or SHLM_PARTITION, SHLM_ACCOUNT, SHLM_GPUS_PER_NODE;
# LAUNCHER (srun|mpirun), NET_IF, SHLM_SETUP, SHLM_WRAP, SHARDLM pass through to the jobs.
# Exit status: 0 submitted (or reported), 1 a submission or the report failed, 2 usage.
set -u

# ---- site settings ----
PARTITION=${SHLM_PARTITION:-}          # sbatch -p: the partition with the GPU nodes (empty: the default)
ACCOUNT=${SHLM_ACCOUNT:-}              # sbatch -A: the allocation to charge (empty: your default)
GPUS_PER_NODE=${SHLM_GPUS_PER_NODE:-8} # GPUs per node (one rank each)
SHLM_INSTALLED_BIN=                    # make install writes <bindir>/shardlm here: the default SHARDLM

here=$(cd "$(dirname "$0")" && pwd)
home=$(dirname "$here") # holds benchmarks/ (source tree or <prefix>/share/shardlm)
die() { echo "strong-scaling-submit.sh: error: $*" >&2; exit 2; }
nodes_list=1,2,4,8,16 gpn=$GPUS_PER_NODE rpn="" global="" out="" extra="" dry=0 report=""
drv=()
while [ $# -gt 0 ]; do
    case $1 in
    --nodes) nodes_list=${2:?}; shift 2 ;;
    --gpus-per-node) gpn=${2:?}; shift 2 ;;
    --ranks-per-node) rpn=${2:?}; shift 2 ;;
    --global-batch) global=${2:?}; shift 2 ;;
    --steps | --warmup | --repeat | --threads) drv+=("$1" "${2:?}"); shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --sbatch) extra=${2?}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --report) report=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
    esac
done
rpn=${rpn:-$gpn}
for n in $(echo "$nodes_list" | tr ',' ' ') $gpn $rpn ${global:-1}; do
    case $n in '' | *[!0-9]*) die "not a whole number: '$n'" ;; esac
done
[ "$rpn" -ge 1 ] || die "--ranks-per-node must be >= 1 (CPU runs: --gpus-per-node 0 --ranks-per-node R)"

# ---- the last step: merge the points, print and draw the report ----
if [ -n "$report" ]; then
    [ -d "$report" ] || die "no such directory: $report"
    csv=$report/scaling.csv
    set -- "$report"/nodes*/scaling.csv
    [ -f "$1" ] || { echo "strong-scaling-submit.sh: no point finished: no $report/nodes*/scaling.csv" >&2; exit 1; }
    # one header, the rows in world-size order (report.sh's baseline is the smallest)
    { head -n 1 "$1"; for f in "$@"; do tail -n +2 "$f"; done | sort -t, -k1,1n; } >"$csv"
    echo "strong-scaling-submit.sh: merged $# point(s) into $csv"
    sh "$home/benchmarks/report.sh" --png "$report/scaling.png" --gpus-per-node "$rpn" \
        --title "shardlm strong scaling" "$csv" | tee "$report/report.txt"
    exit "${PIPESTATUS[0]}"
fi

[ $# -ge 1 ] || die "no job file given (usage: $0 [options] JOB.ini [--set section.key=value ...])"
job=$1
[ -f "$job" ] || die "no such job file: $job"
shift
job=$(cd "$(dirname "$job")" && pwd)/$(basename "$job")
[ -f "$home/benchmarks/strong_scaling.sh" ] || die "no $home/benchmarks/strong_scaling.sh next to $here"

if [ -z "${SHARDLM:-}" ]; then
    # under SHLM_WRAP (a container) the jobs run the container's shardlm
    if [ -n "${SHLM_WRAP:-}" ]; then SHARDLM=shardlm
    elif [ -n "$SHLM_INSTALLED_BIN" ]; then SHARDLM=$SHLM_INSTALLED_BIN
    elif [ -x ./shardlm ]; then SHARDLM=$(pwd)/shardlm; else SHARDLM=$(command -v shardlm || true); fi
fi
[ -n "$SHARDLM" ] || die "no shardlm binary: set SHARDLM=/path/to/shardlm"

# one global batch for every point: the driver would otherwise pick one per job
max=0
for n in $(echo "$nodes_list" | tr ',' ' '); do [ "$n" -gt "$max" ] && max=$n; done
max_ranks=$((max * rpn))
sets=()
for kv in "$@"; do [ "$kv" = --set ] || sets+=(--set "${kv#--set=}"); done
if [ -z "$global" ]; then
    # shellcheck disable=SC2086 # the wrapper's words
    plan=$(${SHLM_WRAP:-} "$SHARDLM" plan "$job" --ranks 1 "${sets[@]}" 2>&1) || die "shardlm plan failed: $plan"
    mb=$(echo "$plan" | sed -n 's/^# micro_batch \([0-9]*\) x seq_len.*/\1/p')
    global=$(echo "$plan" | sed -n 's/.* global batch \([0-9]*\),.*/\1/p')
    [ -n "$mb" ] && [ -n "$global" ] || die "cannot read the batch from: $plan"
    [ $((global % (mb * max_ranks))) -eq 0 ] || global=$((mb * max_ranks))
fi

[ -n "$out" ] || out=results/strong-$(basename "$job" .ini)-$(date +%Y%m%d-%H%M%S)
[ $dry = 1 ] || mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" 2>/dev/null && pwd || echo "$out")
export SHARDLM SHLM_HOME=$home SHLM_SWEEP_OUT=$out

opts=(--parsable)
[ -n "$PARTITION" ] && opts+=(--partition="$PARTITION")
[ -n "$ACCOUNT" ] && opts+=(--account="$ACCOUNT")
# shellcheck disable=SC2206 # the user's sbatch options, split on spaces on purpose
more=($extra)

submit() { # prints the job id
    if [ $dry = 1 ]; then echo "sbatch $*" >&2; echo "JOB"; return 0; fi
    o=$(sbatch "$@") || return 1
    echo "${o%%;*}"
}
ids=()
for n in $(echo "$nodes_list" | tr ',' ' '); do
    id=$(submit "${opts[@]}" --nodes="$n" --ntasks-per-node="$rpn" --gpus-per-node="$gpn" \
        "${more[@]}" "$here/strong-scaling.sbatch" --global-batch "$global" "${drv[@]}" \
        "$job" "${sets[@]}") || { echo "strong-scaling-submit.sh: error: sbatch failed for $n node(s)" >&2; exit 1; }
    ids+=("$id")
    echo "strong-scaling-submit.sh: $n node(s) x $rpn rank(s), global batch $global: job $id"
done
dep=$(IFS=:; echo "${ids[*]}")
id=$(submit "${opts[@]}" --job-name=shardlm-scaling-report --nodes=1 --ntasks=1 \
    --cpus-per-task=1 --time=00:10:00 --dependency="afterany:$dep" --output="$out/report-%j.out" \
    --wrap "bash '$here/strong-scaling-submit.sh' --report '$out' --ranks-per-node $rpn") ||
    { echo "strong-scaling-submit.sh: error: sbatch failed for the report job" >&2; exit 1; }
echo "strong-scaling-submit.sh: report job $id (after ${ids[*]}): $out/report.txt, $out/scaling.png"
echo "strong-scaling-submit.sh: by hand: bash $here/strong-scaling-submit.sh --report $out --ranks-per-node $rpn"
