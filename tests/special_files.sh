#!/bin/sh
# Nothing shardlm writes replaces or truncates a FIFO, a character device, a socket or a
# directory found at the name it writes (made here in the work directory: mkfifo, mknod
# of the null device's numbers as root, a Unix socket bound by python3, mkdir). Each is
# refused with one error line naming the path and what is there, and is still what it
# was afterwards:
#  1. data prepare's and data random's OUT (before any tokenizing);
#  2. ckpt export: config.json, model.safetensors, a shard, the index (before any weights
#     are written);
#  3. a training job: shardlm.lock and metrics.jsonl before step 1 (a FIFO at
#     metrics.jsonl must not hang the start either), step_2.h5 at the save (latest not
#     written), trace.rank0.jsonl; a FIFO at summary.json is a warning and stays;
#  4. generate --dump-logits writes into a FIFO (to a reader: the bytes of a dump into a
#     regular file) and into a character device as they are; a socket or a directory
#     there is refused;
#  5. plot (with gnuplot): loss.png and gnuplot.log.
# A kind that cannot be made here (mknod without root, no python3 for the socket) is
# reported as SKIP for its cases.
#   SHLM=./shardlm SHLM_SRCDIR=. sh tests/special_files.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"
. "$SHLM_SRCDIR/tests/lib.sh"
test_begin special_files shlm-special
ok() { echo "special_files: ok: $*"; }
skips=0
skip() {
    echo "special_files: SKIP: $*"
    skips=$((skips + 1))
}

# make_special KIND PATH: makes a fifo, chardev, socket or dir at PATH; 1 when this machine
# cannot (said as SKIP by the caller)
make_special() {
    case $1 in
    fifo) mkfifo "$2" ;;
    chardev) mknod "$2" c 1 3 2>/dev/null ;;
    socket) python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$2" \
        2>/dev/null ;;
    dir) mkdir "$2" ;;
    esac
}
# what_is PATH: stat's word for what PATH is
what_is() { stat -c %F "$1" 2>/dev/null || echo missing; }
# the words the error line must hold for each kind
kind_words() {
    case $1 in
    fifo) echo "is a FIFO" ;;
    chardev) echo "is a character device" ;;
    socket) echo "is a socket" ;;
    dir) echo "is a directory" ;;
    esac
}

# run NAME CMD...: CMD (at most 120 s; stdout NAME.out, stderr NAME.err), status in $rc
run() {
    rn=$1
    shift
    echo "+ $*"
    timeout -k 10 120 "$@" >"$work/$rn.out" 2>"$work/$rn.err" </dev/null
    rc=$?
}

# refused NAME KIND PATH: the last run failed with one error line naming PATH and what KIND
# of thing it is, and PATH is still that ($2 made it: $want is what_is's word for it)
refused() {
    why=$(error_line_problem "$work/$1.err" "$3" "$(kind_words "$2")")
    if [ "$rc" -eq 124 ]; then
        fail "$1: hung (killed after 120 s)"
    elif [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then
        fail "$1: exit status $rc, expected a refusal: $(head -c 300 "$work/$1.err")"
    elif [ -n "$why" ]; then
        fail "$1: $why: $(head -c 300 "$work/$1.err")"
    else
        ok "$1: $(cat "$work/$1.err")"
    fi
    intact "$1" "$3"
}
# intact NAME PATH: PATH is still what it was when made ($want); else a failure (status 1)
intact() {
    now=$(what_is "$2")
    [ "$now" = "$want" ] && return 0
    fail "$1: $2 was $want, is now $now"
    return 1
}
# special NAME KIND PATH: makes KIND at PATH (setting $want); 1 with a SKIP when it cannot
special() {
    if ! make_special "$2" "$3"; then
        skip "$1: cannot make a $2 here ($(id -un), $(command -v python3 || echo no python3))"
        return 1
    fi
    want=$(what_is "$3")
}
before_step1() {
    if grep -q '^ *1/[0-9]* |' "$work/$1.out"; then fail "$1: refused only after training began"; fi
}

prepare_corpus "$work/train.bin"
head -c 3000 "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt" >"$work/in.txt"

# ---- 1. data prepare and data random ----
for k in fifo chardev socket dir; do
    special "prepare-$k" $k "$work/out-$k.bin" || continue
    run "prepare-$k" "$SHLM" data prepare --tokenizer bytes "$work/in.txt" "$work/out-$k.bin"
    refused "prepare-$k" $k "$work/out-$k.bin"
done
special random-fifo fifo "$work/random.bin" && {
    run random-fifo "$SHLM" data random --vocab 100 --tokens 100 "$work/random.bin"
    refused random-fifo fifo "$work/random.bin"
}

# ---- 3 (first: its checkpoint is 2's and 4's source). A training job ----
# train NAME [--set ...]: 2 steps saving at step 2 into $ck, run dir $rd
train() {
    tn=$1
    shift
    run "$tn" "$SHLM" train "$job" --set "data.train=$work/train.bin" --set train.steps=2 \
        --set train.warmup_steps=1 --set "checkpoint.dir=$ck" --set "log.run_dir=$rd" "$@"
}
fresh() {
    ck="$work/$1/ck"
    rd="$work/$1/run"
    mkdir -p "$ck" "$rd"
}
fresh src
train src
src="$ck"
[ "$rc" -eq 0 ] && [ -f "$src/step_2.h5" ] || { cat "$work/src.err"; fail "the 2-step run saved no checkpoint"; }
fresh lock
special lock fifo "$ck/shardlm.lock" && {
    train lock
    refused lock fifo "$ck/shardlm.lock"
    before_step1 lock
}
fresh metrics
special metrics fifo "$rd/metrics.jsonl" && {
    train metrics
    refused metrics fifo "$rd/metrics.jsonl"
    before_step1 metrics
}
fresh save
special save chardev "$ck/step_2.h5" && {
    train save
    refused save chardev "$ck/step_2.h5"
    [ ! -e "$ck/latest" ] || fail "save: latest was written: $(cat "$ck/latest")"
}
fresh trace
special trace fifo "$rd/trace.rank0.jsonl" && {
    train trace --set fsdp.trace=true
    refused trace fifo "$rd/trace.rank0.jsonl"
}
fresh summary
special summary fifo "$rd/summary.json" && {
    train summary
    if [ "$rc" -ne 0 ]; then
        fail "summary: exit status $rc: $(cat "$work/summary.err")"
    elif ! grep -q -F "warning: $rd/summary.json is a FIFO" "$work/summary.err"; then
        fail "summary: no warning naming $rd/summary.json as a FIFO: $(cat "$work/summary.err")"
    else
        ok "summary: $(cat "$work/summary.err")"
    fi
    intact summary "$rd/summary.json"
}

# ---- 2. ckpt export ----
x="$work/export"
# export_case NAME KIND FILE [OPTIONS]: KIND at FILE in a fresh export directory
export_case() {
    en=$1 ek=$2 ef=$3
    shift 3
    rm -rf "$x"
    mkdir -p "$x"
    special "$en" "$ek" "$x/$ef" || return
    run "$en" "$SHLM" ckpt export "$src" "$x" "$@"
    refused "$en" "$ek" "$x/$ef"
    [ -z "$(cd "$x" && ls | grep -v -x -F "$ef")" ] || fail "$en: files were written: $(ls "$x")"
}
export_case export-config fifo config.json
export_case export-weights chardev model.safetensors
export_case export-shard socket model-00002-of-00007.safetensors --shard-size 60000
export_case export-index dir model.safetensors.index.json --shard-size 60000
[ -d "$x" ] && rm -rf "$x" && run export-names "$SHLM" ckpt export "$src" "$x" --shard-size 60000
[ -f "$x/model-00002-of-00007.safetensors" ] ||
    fail "the export with --shard-size 60000 is not 7 shards (the case above assumed it): $(ls "$x")"

# ---- 4. generate --dump-logits ----
# dump NAME PATH: generate from the source checkpoint dumping the logits into PATH
dump() {
    run "$1" "$SHLM" generate "$job" --ckpt "$src" --prompt-ids 1,2,3 --tokens 1 \
        --dump-logits "$2" --set "data.train=$work/train.bin"
}
dump dump-file "$work/logits.safetensors"
[ "$rc" -eq 0 ] && [ -s "$work/logits.safetensors" ] || fail "dump into a file: $(cat "$work/dump-file.err")"
special dump-fifo fifo "$work/logits.fifo" && {
    cat "$work/logits.fifo" >"$work/logits.read" &
    reader=$!
    dump dump-fifo "$work/logits.fifo"
    # a FIFO no one wrote into (replaced by a file) leaves its reader waiting
    waited=0
    while kill -0 $reader 2>/dev/null && [ $waited -lt 10 ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if kill -0 $reader 2>/dev/null; then
        kill $reader
        fail "dump-fifo: the FIFO's reader got no end of file in 10 s"
    fi
    wait $reader
    if [ "$rc" -ne 0 ]; then
        fail "dump-fifo: exit status $rc: $(cat "$work/dump-fifo.err")"
    elif ! cmp -s "$work/logits.read" "$work/logits.safetensors"; then
        fail "dump-fifo: the FIFO's reader got other bytes than a dump into a file"
    else
        ok "dump-fifo: the reader got the $(wc -c <"$work/logits.read")-byte dump"
    fi
    intact dump-fifo "$work/logits.fifo"
}
special dump-chardev chardev "$work/null" && {
    dump dump-chardev "$work/null"
    [ "$rc" -eq 0 ] || fail "dump-chardev: exit status $rc: $(cat "$work/dump-chardev.err")"
    intact dump-chardev "$work/null" && ok "dump-chardev: written into $work/null, still $want"
}
for k in socket dir; do
    special "dump-$k" $k "$work/logits-$k" || continue
    dump "dump-$k" "$work/logits-$k"
    refused "dump-$k" $k "$work/logits-$k"
done

# ---- 5. plot ----
if command -v gnuplot >/dev/null 2>&1; then
    for c in "fifo loss.png" "chardev gnuplot.log"; do
        set -- $c
        rm -rf "$work/plots"
        mkdir -p "$work/plots"
        special "plot-$2" "$1" "$work/plots/$2" || continue
        run "plot-$2" "$SHLM" plot --out "$work/plots" "$work/src/run"
        refused "plot-$2" "$1" "$work/plots/$2"
    done
else
    skip "plot: no gnuplot (Debian: apt-get install gnuplot-nox)"
fi

[ "$skips" -eq 0 ] || echo "special_files: $skips case(s) skipped"
test_end
