#!/bin/sh
# Help: `shardlm CMD --help` (and -h) prints that command's usage on stdout and exits 0,
# for every command and subcommand, on one process and, for the MPI commands, under the
# launcher too; `shardlm keys` lists every job key with its default and meaning; and the
# key table of README.md is exactly `shardlm keys --markdown` (one source for both: the key
# table of src/job/config.c).
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/cli_help.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
. "$SHLM_SRCDIR/tests/lib.sh"
test_begin cli_help shlm-help

# help CMD...: shardlm CMD... exits 0, stdout begins "usage: shardlm", stderr is empty
help() {
    for flag in --help -h; do
        "$SHLM" "$@" $flag >"$work/out" 2>"$work/err" </dev/null
        rc=$?
        if [ $rc -ne 0 ] || [ -s "$work/err" ] || ! head -n 1 "$work/out" | grep -q '^usage: shardlm'; then
            sed 's/^/    /' "$work/err" | head -n 3
            fail "shardlm $* $flag: exit $rc, $(wc -l <"$work/err") stderr lines, stdout '$(head -n 1 "$work/out")'"
            return
        fi
    done
    echo "cli_help: ok: shardlm $* --help: $(head -n 1 "$work/out")"
}
help
for c in train eval generate plan keys "data prepare" "data encode" "data decode" \
    "data tokenizer" "data random" ckpt "ckpt info" "ckpt verify" "ckpt export"; do
    # shellcheck disable=SC2086 # a command and its subcommand
    help $c
done
sh "$SHLM_SRCDIR/tests/mpi_test.sh" 2 "$SHLM" generate --help >"$work/mpi.out" 2>"$work/mpi.err" </dev/null
rc=$?
if [ $rc -ne 77 ]; then
    if [ $rc -ne 0 ] || [ "$(grep -c '^usage: shardlm generate' "$work/mpi.out")" -ne 1 ]; then
        fail "generate --help on 2 ranks: exit $rc, usage printed $(grep -c '^usage:' "$work/mpi.out") times (once: rank 0)"
    else
        echo "cli_help: ok: generate --help on 2 ranks prints the usage once and exits 0"
    fi
else
    skip_part "generate --help on 2 ranks: no MPI launcher"
fi

# ---- shardlm keys and README.md's table ----
"$SHLM" keys >"$work/keys.txt" || fail "shardlm keys exited $?"
n=$(grep -c '^  [a-z]*\.[a-z_0-9]* ' "$work/keys.txt")
undocumented=$(awk '/^  [a-z]+\.[a-z_0-9]+ / && NF < 3' "$work/keys.txt")
[ -z "$undocumented" ] || fail "keys without a default or meaning: $undocumented"
for k in model.init_from model.tie_word_embeddings train.seq_len data.tokenizer checkpoint.dir; do
    grep -q "^  $k " "$work/keys.txt" || fail "shardlm keys does not list $k"
done
echo "cli_help: ok: shardlm keys lists $n keys, each with a default and a meaning"
"$SHLM" keys --markdown >"$work/keys.md"
sed -n '/^<!-- shardlm keys --markdown -->$/,/^<!-- end of shardlm keys --markdown -->$/p' \
    "$SHLM_SRCDIR/README.md" | sed '1d;$d' >"$work/readme.md"
if [ ! -s "$work/readme.md" ] || ! cmp -s "$work/keys.md" "$work/readme.md"; then
    diff "$work/keys.md" "$work/readme.md" | head -n 10
    fail "README.md's key table is not \`shardlm keys --markdown\` (regenerate it between its markers)"
else
    echo "cli_help: ok: README.md's key table is shardlm keys --markdown ($n keys)"
fi
test_end
