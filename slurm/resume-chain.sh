#!/bin/bash
# Submits a resume chain: K jobs of slurm/train.sbatch, each starting when the one before
# it has ended in any way (--dependency=afterany), each resuming from
# <checkpoint.dir>/latest (checkpoint.resume = auto). A job that reaches its time limit
# gets Slurm's warning signal, saves and exits 0; one that crashes leaves the last
# committed checkpoint; either way the next continues. The job that finishes training
# cancels the jobs left (train.sbatch, through the chain file), so unneeded links never
# start.
#
#   slurm/resume-chain.sh [options] JOB.ini [--set section.key=value ...]
#     -n, --jobs K      jobs in the chain (default 4)
#     --dir DIR         run directory: log.run_dir = DIR, checkpoint.dir = DIR/checkpoints
#                       (default: the job's own; without a checkpoint.dir in the job file
#                       or a --set, runs/<job name>/checkpoints beside shardlm's default
#                       run directory); a --set of either key wins
#     --after JOBID     the first job waits for JOBID too (extend a running chain)
#     --sbatch "OPTS"   more sbatch options for every job (--nodes=4 --time=12:00:00 ...)
#     --dry-run         print the sbatch commands, submit nothing
# Site values: the variables below, or SHLM_PARTITION, SHLM_ACCOUNT, SHLM_GPUS_PER_NODE in
# the environment; LAUNCHER, NET_IF, SHLM_SETUP, SHLM_WRAP, SHARDLM (train.sbatch's) pass
# through to the jobs.
# Prints one line per job and the scancel command that stops the whole chain.
# Exit status: 0 all submitted, 1 a submission failed (the jobs submitted stay), 2 usage.
set -u

# ---- site settings ----
PARTITION=${SHLM_PARTITION:-}          # sbatch -p: the partition with the GPU nodes (empty: the default)
ACCOUNT=${SHLM_ACCOUNT:-}              # sbatch -A: the allocation to charge (empty: your default)
GPUS_PER_NODE=${SHLM_GPUS_PER_NODE:-}  # GPUs and ranks per node (empty: train.sbatch's #SBATCH values)
SHLM_INSTALLED_BIN=                    # make install writes <bindir>/shardlm here: the default SHARDLM

here=$(cd "$(dirname "$0")" && pwd)
die() { echo "resume-chain.sh: error: $*" >&2; exit 2; }
jobs=4 dir="" after="" extra="" dry=0
while [ $# -gt 0 ]; do
    case $1 in
    -n | --jobs) jobs=${2:?}; shift 2 ;;
    --dir) dir=${2:?}; shift 2 ;;
    --after) after=${2:?}; shift 2 ;;
    --sbatch) extra=${2?}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h | --help) sed -n '2,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] || die "no job file given (usage: $0 [options] JOB.ini [--set section.key=value ...])"
case $jobs in '' | *[!0-9]* | 0) die "--jobs needs a whole number >= 1" ;; esac
job=$1
shift
[ -f "$job" ] || die "no such job file: $job"

# the user's --set words, and which keys they set
sets=() user_keys=" "
while [ $# -gt 0 ]; do
    case $1 in
    --set) [ $# -ge 2 ] || die "--set needs section.key=value"; kv=$2; shift 2 ;;
    --set=*) kv=${1#--set=}; shift ;;
    *) die "after the job file only --set section.key=value may follow, not '$1'" ;;
    esac
    sets+=(--set "$kv")
    user_keys="$user_keys${kv%%=*} "
done
has() { case $user_keys in *" $1 "*) return 0 ;; esac; return 1; }
# does the job file set KEY (section.key)?
in_file() {
    awk -v sec="${1%%.*}" -v key="${1#*.}" '
        /^[ \t]*\[/ { gsub(/[][ \t]/, ""); cur = $0; next }
        cur == sec { k = $0; sub(/[ \t]*=.*/, "", k); gsub(/^[ \t]+/, "", k); if (k == key) found = 1 }
        END { exit !found }' "$job"
}

# where the run and its checkpoints go: the same for every job of the chain
chain=()
if [ -n "$dir" ]; then
    has log.run_dir || chain+=(--set "log.run_dir=$dir")
    has checkpoint.dir || chain+=(--set "checkpoint.dir=$dir/checkpoints")
elif ! has checkpoint.dir && ! in_file checkpoint.dir; then
    # beside shardlm's default run directory (runs/<job name>, from the submit directory)
    chain+=(--set "checkpoint.dir=runs/$(basename "$job" .ini)/checkpoints")
fi
case " ${sets[*]-} " in
*" checkpoint.resume=auto "* | *" checkpoint.resume= "*) ;;
*" checkpoint.resume="*) die "a chain resumes from latest: leave out --set checkpoint.resume (it sets auto)" ;;
esac
has checkpoint.resume || chain+=(--set checkpoint.resume=auto)

# one binary for the whole chain (train.sbatch's default, resolved now)
if [ -z "${SHARDLM:-}" ]; then
    # under SHLM_WRAP (a container) the jobs run the container's shardlm
    if [ -n "${SHLM_WRAP:-}" ]; then SHARDLM=shardlm
    elif [ -n "$SHLM_INSTALLED_BIN" ]; then SHARDLM=$SHLM_INSTALLED_BIN
    elif [ -x ./shardlm ]; then SHARDLM=$(pwd)/shardlm; else SHARDLM=$(command -v shardlm || true); fi
fi
[ -n "$SHARDLM" ] || [ $dry = 1 ] || die "no shardlm binary: set SHARDLM=/path/to/shardlm"
export SHARDLM

opts=(--parsable --job-name="shardlm-$(basename "$job" .ini)")
[ -n "$PARTITION" ] && opts+=(--partition="$PARTITION")
[ -n "$ACCOUNT" ] && opts+=(--account="$ACCOUNT")
[ -n "$GPUS_PER_NODE" ] && opts+=(--gpus-per-node="$GPUS_PER_NODE" --ntasks-per-node="$GPUS_PER_NODE")
# shellcheck disable=SC2206 # the user's sbatch options, split on spaces on purpose
opts+=($extra)

# the chain file: job ids in order, read by train.sbatch to cancel the rest when done
# (in --dir, else in the submit directory)
[ $dry = 1 ] || mkdir -p "${dir:-.}" || die "cannot create ${dir:-.}"
list=$(cd "${dir:-.}" 2>/dev/null && pwd)/shardlm-chain-$(date +%Y%m%d-%H%M%S)-$$.jobs
[ $dry = 1 ] || : >"$list" || die "cannot write $list"
export SHLM_CHAIN_FILE=$list

prev=$after ids=()
for i in $(seq 1 "$jobs"); do
    dep=()
    [ -n "$prev" ] && dep=(--dependency="afterany:$prev")
    cmd=(sbatch "${opts[@]}" "${dep[@]}" "$here/train.sbatch" "$job" "${sets[@]}" "${chain[@]}")
    if [ $dry = 1 ]; then
        echo "${cmd[*]}"
        prev="JOB$i"
        continue
    fi
    out=$("${cmd[@]}") || {
        echo "resume-chain.sh: error: sbatch failed for job $i of $jobs: ${cmd[*]}" >&2
        [ ${#ids[@]} -gt 0 ] && echo "resume-chain.sh: submitted so far: ${ids[*]}" >&2
        exit 1
    }
    id=${out%%;*}
    ids+=("$id")
    echo "$id" >>"$list"
    echo "resume-chain.sh: job $i of $jobs: $id${prev:+ (after $prev)}"
    prev=$id
done
[ $dry = 1 ] && exit 0
echo "resume-chain.sh: chain ${ids[*]} (list: $list)"
echo "resume-chain.sh: to stop it: scancel ${ids[*]}"
