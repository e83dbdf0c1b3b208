#!/bin/sh
# Bad input at the command line: every case must end with exactly one line on stderr,
# "shardlm: error: ...", naming what is wrong and where (file:line, --set key, file name),
# a non-zero exit below 128 (no crash), and no hang (timeout). Single-rank cases run the
# binary directly (an MPI singleton); a few run again on 2 ranks under mpirun, where the
# line must appear once and every rank must exit non-zero.
#   env SHLM=./shardlm SHLM_SRCDIR=. sh tests/cli_errors.sh
set -u
: "${SHLM:?set SHLM to the shardlm binary}" "${SHLM_SRCDIR:?set SHLM_SRCDIR to the source tree}"

T=$(mktemp -d "${TMPDIR:-/tmp}/shlm-cli.XXXXXX") || exit 99
# SHLM_KEEP_TMP=1 keeps the job and token files, so a printed command can be rerun
trap '[ -n "${SHLM_KEEP_TMP:-}" ] || rm -rf "$T"' EXIT
trap 'exit 130' INT TERM
limit=${SHLM_TEST_TIMEOUT:-30}
wrap=""
command -v timeout >/dev/null 2>&1 && wrap="timeout -k 5 $limit"
n_fail=0
n_ok=0

. "$SHLM_SRCDIR/tests/lib.sh"
fail() { echo "FAIL: $*"; n_fail=$((n_fail + 1)); }

# run CMD...: runs one command (under timeout), stdout to $T/out, stderr to $T/err, $rc
run() {
    echo "+ $*"
    # shellcheck disable=SC2086
    $wrap "$@" >"$T/out" 2>"$T/err" </dev/null
    rc=$?
}

# crashed: the last run died of a signal, timed out or printed a crash report
crashed() {
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "timed out after $limit s"
    elif [ "$rc" -ge 128 ]; then
        echo "exit status $rc (killed by a signal)"
    elif grep -q -i -e 'segmentation' -e 'core dumped' -e 'MPI_ABORT' -e 'signal [0-9]' \
        -e 'AddressSanitizer' "$T/out" "$T/err"; then
        echo "crash report in the output: $(grep -i -h -m1 -e segmentation -e 'core dumped' \
            -e MPI_ABORT -e 'signal [0-9]' -e AddressSanitizer "$T/out" "$T/err")"
    fi
}

# expect NAME PATTERN...: the last run failed cleanly with one error line holding every
# PATTERN (fixed strings)
expect() {
    name=$1
    shift
    sed 's/^/    stderr: /' "$T/err"
    why=$(crashed)
    if [ -n "$why" ]; then
        fail "$name: $why"
        return
    fi
    if [ "$rc" -eq 0 ]; then
        fail "$name: exit status 0, expected non-zero"
        return
    fi
    why=$(error_line_problem "$T/err" "$@")
    if [ -n "$why" ]; then
        fail "$name: $why"
        return
    fi
    echo "ok: $name (exit $rc)"
    n_ok=$((n_ok + 1))
}

# ---- inputs: the bundled corpus, a small model, hand-made token files ----

run "$SHLM" data prepare --tokenizer bytes "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt" \
    "$T/train.bin"
if [ $rc -ne 0 ]; then
    cat "$T/err"
    echo "FAIL: cannot prepare the corpus"
    exit 1
fi

# job NAME: writes $T/NAME.ini, the small model reading train.bin (relative to the job)
job() {
    cp "$SHLM_SRCDIR/tests/jobs/small.ini" "$T/$1.ini"
    printf '\n[log]\nrun_dir = run\n' >>"$T/$1.ini"
}
job small
J=$T/small.ini

# little-endian bytes with printf octal escapes (no od/xxd/python needed)
# shellcheck disable=SC2059 # the format is the octal escape itself
byte() { printf "\\$(printf %03o "$(($1 & 255))")"; }
le16() { byte "$1"; byte "$(($1 >> 8))"; }
le32() { le16 "$(($1 & 65535))"; le16 "$((($1 >> 16) & 65535))"; }
# tokfile OUT VOCAB ID...: a version-1 token file of 2-byte ids (header: io/tokens.h)
tokfile() {
    out=$1 vocab=$2
    shift 2
    {
        printf 'SHLMTOK\000'
        le32 1
        le32 2
        le32 $#
        le32 0
        le32 "$vocab"
        le32 0
        for id in "$@"; do le16 "$id"; done
    } >"$out"
}
ids=$(awk 'BEGIN { for (i = 0; i < 100; i++) printf "%d ", (7 * i) % 200 }')
# shellcheck disable=SC2086
tokfile "$T/ok.bin" 256 $ids

# the baseline runs: a typo below is the only thing wrong with each case
run "$SHLM" train "$J" --set train.steps=1 --set data.train="$T/ok.bin"
if [ $rc -ne 0 ]; then
    cat "$T/err"
    echo "FAIL: the baseline job does not train; the cases below would prove nothing"
    exit 1
fi
echo "ok: baseline job trains"

# ---- the job file ----

job nodata
sed -i '/^train = /d' "$T/nodata.ini"
run "$SHLM" train "$T/nodata.ini"
expect "missing [data] train" nodata.ini "[data] train" required

job nosteps
sed -i '/^steps = /d' "$T/nosteps.ini"
run "$SHLM" train "$T/nosteps.ini"
expect "missing [train] steps" nosteps.ini "[train] steps" required

job unkkey
sed -i 's/^steps = 2$/steps = 2\nstepz = 3/' "$T/unkkey.ini"
ln=$(grep -n '^stepz' "$T/unkkey.ini" | cut -d: -f1)
run "$SHLM" train "$T/unkkey.ini"
expect "unknown key in the job file" "unkkey.ini:$ln" "'stepz'" "[train]"

job badval
sed -i 's/^steps = 2$/steps = two/' "$T/badval.ini"
ln=$(grep -n '^steps' "$T/badval.ini" | cut -d: -f1)
run "$SHLM" train "$T/badval.ini"
expect "malformed value in the job file" "badval.ini:$ln" steps "'two'"

job badrange
sed -i 's/^micro_batch = 1$/micro_batch = -4/' "$T/badrange.ini"
ln=$(grep -n '^micro_batch' "$T/badrange.ini" | cut -d: -f1)
run "$SHLM" train "$T/badrange.ini"
expect "out-of-range value in the job file" "badrange.ini:$ln" micro_batch "-4"

job unksec
printf '[bogus]\nx = 1\n' >>"$T/unksec.ini"
ln=$(grep -n '^\[bogus\]' "$T/unksec.ini" | cut -d: -f1)
run "$SHLM" train "$T/unksec.ini"
expect "unknown section" "unksec.ini:$ln" "[bogus]"

# a misspelt [fsdp]: the hint and the list of known sections must both hold it
job typosec
printf '[fdsp]\nstrategy = NO_SHARD\n' >>"$T/typosec.ini"
ln=$(grep -n '^\[fdsp\]' "$T/typosec.ini" | cut -d: -f1)
run "$SHLM" train "$T/typosec.ini"
expect "misspelt section" "typosec.ini:$ln" "[fdsp]" "did you mean [fsdp]"
known=$(sed -n 's/.*known: \([^)]*\)).*/\1/p' "$T/err")
missing=""
for s in model train fsdp data log runtime; do
    case " $known " in *" $s "*) ;; *) missing="$missing $s" ;; esac
done
if [ -n "$missing" ]; then
    fail "unknown section: the list of known sections ('$known') lacks:$missing"
else
    echo "ok: unknown section lists every known section"
    n_ok=$((n_ok + 1))
fi

cat >"$T/preset.ini" <<'EOF'
[model]
preset = gpt2-medium
[train]
seq_len = 32
steps = 1
[data]
train = train.bin
EOF
run "$SHLM" train "$T/preset.ini"
expect "unknown preset lists the known ones" "preset.ini:2" "gpt2-medium" tiny tinyllama-1b \
    llama2-7b llama2-13b llama2-70b llama3-8b llama3.2-1b llama3.2-3b llama3-70b

run "$SHLM" train "$T/nonexistent.ini"
expect "missing job file" nonexistent.ini "cannot open"

# ---- --set overrides ----

run "$SHLM" train "$J" --set train.stepz=3
expect "--set unknown key" "--set train.stepz" "'stepz'"

run "$SHLM" train "$J" --set train.steps=abc
expect "--set malformed value" "--set train.steps" "'abc'"

run "$SHLM" train "$J" --set model.dim
expect "--set without a value" "model.dim" "section.key=value"

# q/k/v-only biases are another architecture than LlamaForCausalLM (the qwen2 family's)
run "$SHLM" train "$J" --set model.qkv_bias=true
expect "--set model.qkv_bias on a Llama" "--set model.qkv_bias" "qkv_bias = true" "LlamaForCausalLM"

# a line break inside the section or key is shown as '?': still one line
run "$SHLM" train "$J" --set "$(printf 'tra\nin.steps=5')"
expect "--set with a line break" "--set tra?in.steps" "unknown section"

# ---- the command line ----

run "$SHLM" frobnicate "$J"
expect "unknown command" "unknown command" "'frobnicate'"

run "$SHLM" train "$J" --frobnicate
expect "unknown option" "'--frobnicate'"

run "$SHLM" train
expect "no job file" "no job file"

# ---- token files ----

{
    printf 'NOTATOKN'
    dd if="$T/ok.bin" bs=1 skip=8 2>/dev/null
} >"$T/badmagic.bin"
run "$SHLM" train "$J" --set data.train="$T/badmagic.bin"
expect "token file with a wrong magic" badmagic.bin magic

head -c 1000 "$T/train.bin" >"$T/trunc.bin"
run "$SHLM" train "$J" --set data.train="$T/trunc.bin"
expect "token file with a truncated body" trunc.bin truncated 1054011

: >"$T/empty.bin"
run "$SHLM" train "$J" --set data.train="$T/empty.bin"
expect "empty token file" empty.bin empty

# shellcheck disable=SC2086
tokfile "$T/bigid.bin" 256 $ids 300 $ids
run "$SHLM" train "$J" --set data.train="$T/bigid.bin"
expect "token id >= vocab" bigid.bin 300 "index 100" 256

run "$SHLM" train "$J" --set data.train="$T/missing.bin"
expect "missing data file (--set)" "[data] train" missing.bin "does not exist" "shardlm data prepare --tokenizer bytes FILE"

# a missing .bin beside its text (the installed demo's jobs/data): the exact command
echo "some text" >"$T/corpus.txt"
run "$SHLM" train "$J" --set data.train="$T/corpus.bin"
expect "missing data file beside its text" \
    "shardlm data prepare --tokenizer bytes $T/corpus.txt $T/corpus.bin"

# named in the job file: relative to the job's directory, and the message shows where
job missingdata
sed -i 's/^train = train.bin$/train = nothere.bin/' "$T/missingdata.ini"
run "$SHLM" train "$T/missingdata.ini"
expect "missing data file (job file)" "$T/nothere.bin" "does not exist"

tokfile "$T/tiny.bin" 256 1 2 3 4 5 6 7 8 9 10
run "$SHLM" train "$J" --set data.train="$T/tiny.bin"
expect "seq_len longer than the data" tiny.bin "10 tokens" seq_len
# a validation file shorter than one window: one window, not a training one
run "$SHLM" train "$J" --set data.train="$T/ok.bin" --set data.val="$T/tiny.bin"
expect "a validation file shorter than one window" tiny.bin "10 tokens" "fewer than the 33 of one window"

# shellcheck disable=SC2086
tokfile "$T/v512.bin" 512 $ids
run "$SHLM" train "$J" --set data.train="$T/v512.bin"
expect "token vocab larger than model.vocab_size" v512.bin 512 model.vocab_size 256

run "$SHLM" data prepare --tokenizer bytes "$T/no-such-input.txt" "$T/out.bin"
expect "data prepare with a missing input" no-such-input.txt
if [ -e "$T/out.bin" ]; then fail "data prepare left $T/out.bin behind"; fi

# ---- ckpt ----
run "$SHLM" ckpt export "$T/no-ckpt" "$T/hf" --shard-size -5
expect "ckpt export --shard-size -5" "--shard-size: '-5' is out of range, must be in [1, "
run "$SHLM" ckpt export "$T/no-ckpt" "$T/hf" --shard-size 0x10
expect "ckpt export --shard-size 0x10" "--shard-size: '0x10' is not an integer"

# ---- numbers in options: parsed strictly everywhere (src/base/numbers.h), one line naming the
# option and the value: empty, spaced, trailing text, hexadecimal, nan/inf, past the type,
# out of the range (generate's are its sampling keys' ranges) ----
# num NAME PATTERN -- ARGS...: shardlm ARGS fails with one line naming PATTERN
num() {
    nm=$1 pat=$2
    shift 3
    run "$SHLM" "$@"
    expect "$nm" "$pat"
}
G="generate $J --prompt hi"
# shellcheck disable=SC2086 # G's words
{
num "generate --temperature ''" "--temperature: '' is not a number" -- $G --temperature ""
num "generate --seed ''" "--seed: '' is not an unsigned integer" -- $G --seed ""
num "generate --tokens ''" "--tokens: '' is not an integer" -- $G --tokens ""
num "generate --seed 2^64+" "--seed: '18446744073709551616' is out of range, must be < 2^64" -- \
    $G --seed 18446744073709551616
num "generate --seed -1" "--seed: '-1' is not an unsigned integer" -- $G --seed -1
num "generate --temperature inf" "--temperature: 'inf' is not a number" -- $G --temperature inf
num "generate --temperature nan" "--temperature: 'nan' is not a number" -- $G --temperature nan
num "generate --temperature 1e999" "--temperature: '1e999' is out of range, must be in [0, 100]" -- \
    $G --temperature 1e999
num "generate --temperature 0x1p3" "--temperature: '0x1p3' is not a number" -- $G --temperature 0x1p3
num "generate --temperature ' 0.5'" "--temperature: ' 0.5' is not a number" -- $G --temperature " 0.5"
num "generate --top-p 0" "--top-p: '0' is out of range, must be in (0, 1]" -- $G --top-p 0
num "generate --tokens 5x" "--tokens: '5x' is not an integer" -- $G --tokens 5x
num "generate --tokens 2^24+1" "--tokens: '16777217' is out of range, must be in [0, 16777216]" -- \
    $G --tokens 16777217
num "generate --prompt-ids 1,,2" "--prompt-ids: '' (id 2 of '1,,2') is not a token id" -- \
    generate "$J" --prompt-ids 1,,2
num "generate --prompt-ids ' 5'" "--prompt-ids: ' 5' (id 1 of ' 5')" -- generate "$J" --prompt-ids " 5"
}
# a prompt longer than the context (small.ini: 32 tokens) is refused; --truncate-prompt keeps
# its last 32 tokens and says so
long_prompt=$(awk 'BEGIN { for (i = 0; i < 40; i++) printf "ab" }')
run "$SHLM" generate "$J" --prompt "$long_prompt" --tokens 1
expect "generate: a prompt of 80 tokens, the context 32" "the prompt has 80 tokens, more than the context (train.seq_len = 32)" \
    "its first 48" "--truncate-prompt"
run "$SHLM" generate "$J" --prompt "$long_prompt" --tokens 1 --ids --truncate-prompt
if [ $rc -eq 0 ] && [ "$(grep -c . "$T/err")" -eq 1 ] &&
    grep -q "^shardlm: warning: the prompt has 80 tokens, more than the context (train.seq_len = 32): its first 48 are dropped, its last 32 kept" "$T/err" &&
    [ "$(sed -n 's/^prompt ids: //p' "$T/out" | wc -w)" -eq 32 ]; then
    echo "ok: generate --truncate-prompt: the last 32 of 80 tokens, said in one warning"
    n_ok=$((n_ok + 1))
else
    sed 's/^/    stderr: /' "$T/err"
    fail "generate --truncate-prompt: exit $rc, want 0, one warning and a prompt of 32 ids"
fi
num "data random --vocab ''" "--vocab: '' is not an integer" -- data random --vocab "" --tokens 5 "$T/r.bin"
num "data random --tokens 1" "--tokens: '1' is out of range, must be in [2, " -- \
    data random --vocab 9 --tokens 1 "$T/r.bin"
num "data random --seed 1.5" "--seed: '1.5' is not an unsigned integer" -- \
    data random --vocab 9 --tokens 5 --seed 1.5 "$T/r.bin"
num "data prepare --max-doc-len 0" "--max-doc-len: '0' is out of range, must be in [1, " -- \
    data prepare --tokenizer bytes --max-doc-len 0 "$T/in.txt" "$T/out.bin"
num "plan --ranks ''" "--ranks: '' is not an integer" -- plan "$J" --ranks ""
num "plan --ranks 2.0" "--ranks: '2.0' is not an integer" -- plan "$J" --ranks 2.0
num "plan --device-gib inf" "--device-gib: 'inf' is not a number" -- plan "$J" --ranks 1 --device-gib inf
num "ckpt export --shard-size ''" "--shard-size: '' is not an integer" -- \
    ckpt export "$T/no-ckpt" "$T/hf" --shard-size ""

# ---- on 2 ranks: the line once, every rank exits non-zero by itself ----

# Each rank runs under a wrapper that records its own exit status, and Open MPI is told
# not to kill the other ranks when the first exits non-zero, so each status is real.
cat >"$T/rankrc.sh" <<'EOF'
#!/bin/sh
# rankrc.sh DIR CMD...: runs CMD, writes its exit status to DIR/rc.<pid>
d=$1
shift
"$@"
s=$?
echo $s >"$d/rc.$$"
exit $s
EOF

mpi_skipped=0
# run_mpi NP ARGS...: shardlm ARGS on NP ranks
run_mpi() {
    np=$1
    shift
    rm -rf "$T/rcs"
    mkdir "$T/rcs"
    echo "+ OMPI_MCA_orte_abort_on_non_zero_status=0 sh $SHLM_SRCDIR/tests/mpi_test.sh $np sh $T/rankrc.sh $T/rcs $SHLM $*"
    OMPI_MCA_orte_abort_on_non_zero_status=0 SHLM_TEST_TIMEOUT=$limit \
        sh "$SHLM_SRCDIR/tests/mpi_test.sh" "$np" sh "$T/rankrc.sh" "$T/rcs" "$SHLM" "$@" \
        >"$T/out" 2>"$T/err" </dev/null
    rc=$?
    grep '^+ ' "$T/out"
    if [ $rc -eq 77 ]; then mpi_skipped=1; fi
}

# expect_mpi NAME NP PATTERN...
expect_mpi() {
    name=$1 np=$2
    shift 2
    if [ $mpi_skipped -eq 1 ]; then
        echo "cli_errors: SKIP: $name: no MPI launcher"
        return
    fi
    statuses=$(cat "$T"/rcs/rc.* 2>/dev/null | tr '\n' ' ')
    n=$(find "$T/rcs" -type f -name "rc.*" | wc -l | tr -d ' ')
    echo "    rank exit statuses: $statuses"
    bad=""
    [ "$n" -eq "$np" ] || bad="only $n of $np ranks exited by themselves"
    for s in $statuses; do
        if [ "$s" -eq 0 ]; then bad="a rank exited 0"; elif [ "$s" -ge 128 ]; then
            bad="a rank exited $s (signal)"
        fi
    done
    if [ -n "$bad" ]; then
        sed 's/^/    stderr: /' "$T/err"
        fail "$name: $bad"
        return
    fi
    # the launcher's status is 0 here (abort on non-zero is off): judge by the ranks'
    rc=$(cat "$T"/rcs/rc.* | head -n 1)
    expect "$name" "$@"
}

run_mpi 2 train "$T/unkkey.ini"
expect_mpi "2 ranks: unknown key in the job file" 2 "unkkey.ini:" "'stepz'"

run_mpi 2 train "$J" --set data.train="$T/bigid.bin"
expect_mpi "2 ranks: token id >= vocab" 2 bigid.bin 300

run_mpi 2 train "$J" --frobnicate
expect_mpi "2 ranks: unknown option" 2 "'--frobnicate'"

# as users launch it (Open MPI aborts the job at the first non-zero exit): the launcher's
# own status is non-zero and the error line is printed once
if [ $mpi_skipped -eq 0 ]; then
    SHLM_TEST_TIMEOUT=$limit sh "$SHLM_SRCDIR/tests/mpi_test.sh" 2 "$SHLM" train "$J" \
        --set train.steps=abc >"$T/out" 2>"$T/err" </dev/null
    rc=$?
    grep '^+ ' "$T/out"
    why=$(crashed)
    n=$(grep -c '^shardlm: error: ' "$T/err")
    if [ -n "$why" ]; then
        fail "2 ranks, default launcher: $why"
    elif [ $rc -eq 0 ] || [ "$n" -ne 1 ]; then
        sed 's/^/    stderr: /' "$T/err"
        fail "2 ranks, default launcher: exit $rc, $n error lines (expected non-zero, 1)"
    else
        echo "ok: 2 ranks, default launcher: mpirun exits $rc, one error line"
        n_ok=$((n_ok + 1))
    fi
fi

echo "cli_errors: $n_ok passed, $n_fail failed"
[ $n_fail -ne 0 ] || [ $mpi_skipped -eq 0 ] || skip_test "the cases on 2 ranks: no MPI launcher"
[ $n_fail -eq 0 ]
