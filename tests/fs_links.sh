#!/bin/sh
# No file is written through a planted link. A
# symbolic link pointing outside the directory (at a file, or at nothing) is planted at
# every name shardlm writes: in checkpoint.dir step_<N>.h5, latest, the lock, and the
# temporary names of earlier versions (step_<N>.h5.tmp, latest.tmp); in log.run_dir
# metrics.jsonl (also as a hard link) and trace.rank0.jsonl; in an export directory
# config.json, model.safetensors, a shard and the index, and the old config.json.tmp /
# model.safetensors.tmp; the token file of `data prepare`; generate's --dump-logits. Each
# run either refuses with exactly one error line naming the link (checkpoint.dir and
# run_dir cases before step 1), or, for the old temporary names shardlm no longer writes,
# succeeds without touching them; every time, nothing outside changed and no link target
# was created. `data prepare IN IN` (also through another path, a hard link, a symbolic
# link) is refused and IN kept. The checkpoint cases run on 1 rank and on 2 (the file is
# created by every rank through MPI-IO).
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, MPIRUN), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/fs_links.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"

. "$SHLM_SRCDIR/tests/lib.sh"
test_begin fs_links shlm-fs-links
ok() { echo "fs_links: ok: $*"; }

prepare_corpus "$work/train.bin"
out="$work/outside"
mkdir -p "$out"
echo precious >"$out/victim"
# the state of everything outside: names, sizes and contents
outside_state() { (cd "$out" && ls -lA --time-style=+ | sed 1d && cat ./*) | cksum; }
before=$(outside_state)

# check_outside WHAT: nothing outside changed (no new file either)
check_outside() {
    now=$(outside_state)
    [ "$now" = "$before" ] || fail "$1: something outside changed: $(ls -lA "$out")"
}

# run NAME CMD...: runs CMD (stdout $work/NAME.out, stderr $work/NAME.err), sets $rc
run() {
    name=$1
    shift
    echo "+ $*"
    "$@" >"$work/$name.out" 2>"$work/$name.err" </dev/null
    rc=$?
}

# refused NAME PATTERN...: the last run failed with one error line naming every PATTERN,
# and nothing outside changed
refused() {
    name=$1
    shift
    why=$(error_line_problem "$work/$name.err" "$@")
    if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then
        fail "$name: exit status $rc, expected a refusal (1)"
        sed 's/^/    /' "$work/$name.err" | head -n 5
    elif [ -n "$why" ]; then
        fail "$name: $why"
        sed 's/^/    /' "$work/$name.err" | head -n 5
    else
        ok "$name refused: $(cat "$work/$name.err")"
    fi
    check_outside "$name"
}

# before_step1 NAME: the run printed no training step
before_step1() {
    if grep -q '^ *1/[0-9]* |' "$work/$1.out"; then fail "$1: refused only after training began"; fi
}

# train NAME NP [--set ...]: a 2-step run with checkpoint.dir=$ck and log.run_dir=$rd, on
# 1 rank as a plain process, on more under the launcher (whose own notice of a failed
# rank, a block between dashed lines, is dropped from $work/NAME.err)
train() {
    tn=$1
    np=$2
    shift 2
    set -- train "$job" --set "data.train=$work/train.bin" --set train.steps=2 \
        --set train.warmup_steps=1 --set "checkpoint.dir=$ck" --set "log.run_dir=$rd" "$@"
    if [ "$np" -eq 1 ]; then
        run "$tn" "$SHLM" "$@"
        return
    fi
    run "$tn" sh "$mpi" "$np" "$SHLM" "$@"
    skip_without_launcher "$rc"
    mv "$work/$tn.err" "$work/$tn.err.all"
    awk '/^-----/ { inside = !inside; next } !inside' "$work/$tn.err.all" >"$work/$tn.err"
}

# fresh CASE: new empty checkpoint and run directories $ck and $rd
fresh() {
    ck="$work/$1/ck"
    rd="$work/$1/run"
    mkdir -p "$ck" "$rd"
}

# ---- checkpoint.dir: the temporary names of earlier versions are not followed ----
for np in 1 2; do
    c="oldtmp-$np"
    fresh "$c"
    ln -s "$out/victim" "$ck/step_2.h5.tmp"
    ln -s "$out/new-latest" "$ck/latest.tmp"
    train "$c" "$np"
    if [ "$rc" -ne 0 ]; then
        fail "$c: the run failed: $(cat "$work/$c.err")"
    elif [ -L "$ck/step_2.h5" ] || [ ! -f "$ck/step_2.h5" ] || [ -L "$ck/latest" ] ||
        [ "$(cat "$ck/latest")" != step_2.h5 ]; then
        fail "$c: step_2.h5 or latest is not the file the save wrote: $(ls -lA "$ck")"
    elif [ "$(readlink "$ck/step_2.h5.tmp")" != "$out/victim" ] ||
        [ "$(readlink "$ck/latest.tmp")" != "$out/new-latest" ]; then
        fail "$c: a planted link was moved or removed: $(ls -lA "$ck")"
    else
        ok "$c: links at step_2.h5.tmp and latest.tmp on $np rank(s): saved beside them, not through them"
    fi
    check_outside "$c"
done

# ---- checkpoint.dir: links where a save writes are refused before step 1 ----
for np in 1 2; do
    c="final-$np"
    fresh "$c"
    ln -s "$out/victim" "$ck/step_2.h5"
    train "$c" "$np"
    refused "$c" "$ck/step_2.h5" "symbolic link"
    before_step1 "$c"
done
c=latest-link
fresh "$c"
ln -s "$out/victim" "$ck/latest"
train "$c" 1
refused "$c" "$ck/latest" "symbolic link"
before_step1 "$c"
c=latest-dangling
fresh "$c"
ln -s "$out/new-latest" "$ck/latest"
train "$c" 1
refused "$c" "$ck/latest" "symbolic link"
before_step1 "$c"
c=lock-link
fresh "$c"
ln -s "$out/victim" "$ck/shardlm.lock"
train "$c" 1
refused "$c" "$ck/shardlm.lock" "symbolic link"
before_step1 "$c"
c=lock-dangling
fresh "$c"
ln -s "$out/new-lock" "$ck/shardlm.lock"
train "$c" 1
refused "$c" "$ck/shardlm.lock" "symbolic link"
before_step1 "$c"

# ---- log.run_dir ----
c=metrics-link
fresh "$c"
ln -s "$out/victim" "$rd/metrics.jsonl"
train "$c" 1
refused "$c" "$rd/metrics.jsonl" "symbolic link"
before_step1 "$c"
c=metrics-hardlink
fresh "$c"
ln "$out/victim" "$rd/metrics.jsonl"
train "$c" 1
rm -f "$rd/metrics.jsonl" # the hard link raised the victim's link count
refused "$c" "$rd/metrics.jsonl" "hard links"
before_step1 "$c"
c=trace-link
fresh "$c"
ln -s "$out/victim" "$rd/trace.rank0.jsonl"
train "$c" 1 --set fsdp.trace=true
refused "$c" "$rd/trace.rank0.jsonl" "symbolic link"

# ---- ckpt export ----
src="$work/oldtmp-1/ck"
x="$work/export"
# export_case NAME LINK TARGET [OPTIONS]: a link LINK -> TARGET in a fresh export dir
export_case() {
    en=$1
    link=$2
    target=$3
    shift 3
    rm -rf "$x"
    mkdir -p "$x"
    ln -s "$target" "$x/$link"
    run "$en" "$SHLM" ckpt export "$src" "$x" "$@"
}
for f in config.json model.safetensors; do
    export_case "export-$f" "$f" "$out/victim"
    refused "export-$f" "$x/$f" "symbolic link"
done
export_case export-index model.safetensors.index.json "$out/new-index" --shard-size 100000
refused export-index "$x/model.safetensors.index.json" "symbolic link"
# the first shard's name, from an export of the same checkpoint with the same size
rm -rf "$x"
run export-names "$SHLM" ckpt export "$src" "$x" --shard-size 100000
shard=$(cd "$x" 2>/dev/null && ls model-00001-of-*.safetensors 2>/dev/null)
if [ -z "$shard" ]; then
    fail "export --shard-size 100000 made no shards: $(cat "$work/export-names.err")"
else
    export_case export-shard "$shard" "$out/victim" --shard-size 100000
    refused export-shard "$x/$shard" "symbolic link"
fi
export_case export-oldtmp config.json.tmp "$out/victim"
ln -s "$out/new-st" "$x/model.safetensors.tmp"
run export-oldtmp "$SHLM" ckpt export "$src" "$x"
if [ "$rc" -ne 0 ]; then
    fail "export-oldtmp: the export failed: $(cat "$work/export-oldtmp.err")"
elif [ -L "$x/config.json" ] || [ ! -s "$x/model.safetensors" ] ||
    [ "$(readlink "$x/config.json.tmp")" != "$out/victim" ]; then
    fail "export-oldtmp: the outputs are not regular files beside the links: $(ls -lA "$x")"
else
    ok "export-oldtmp: links at config.json.tmp and model.safetensors.tmp not followed"
fi
check_outside export-oldtmp

# ---- generate --dump-logits ----
ln -s "$out/victim" "$work/logits.safetensors"
run dump "$SHLM" generate "$job" --ckpt "$src" --prompt-ids 1,2,3 --tokens 1 \
    --dump-logits "$work/logits.safetensors" --set "data.train=$work/train.bin"
refused dump "$work/logits.safetensors" "symbolic link"

# ---- data prepare ----
txt="$work/in.txt"
head -c 4000 "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt" >"$txt"
sum=$(cksum <"$txt")
ln -s "$out/victim" "$work/tokens.bin"
run prep-link "$SHLM" data prepare --tokenizer bytes "$txt" "$work/tokens.bin"
refused prep-link "$work/tokens.bin" "symbolic link"
ln "$txt" "$work/in-hard.txt"
ln -s "$txt" "$work/in-sym.txt"
mkdir -p "$work/sub"
for o in "$txt" "$work/sub/../in.txt" "$work/in-hard.txt" "$work/in-sym.txt"; do
    run prep-same "$SHLM" data prepare --tokenizer bytes "$txt" "$o"
    refused prep-same "$o" "is the input file"
    [ "$(cksum <"$txt")" = "$sum" ] || fail "data prepare IN $o changed IN"
done

echo "fs_links: $(($(date +%s) - t_start)) s"
if [ $fails -ne 0 ]; then
    echo "fs_links: FAIL ($fails problems); work directory kept: $work"
    exit 1
fi
[ -n "${KEEP:-}" ] || rm -rf "$work"
echo "fs_links: PASS"
exit 0
