# Shell helpers shared by the command-line tests (sourced, not run).

# error_line_problem FILE PATTERN...: says why FILE (a run's stderr) is not exactly one
# line "shardlm: error: ..." naming every PATTERN (fixed strings); silent when it is.
error_line_problem() {
    elp_file=$1
    shift
    elp_lines=$(wc -l <"$elp_file" | tr -d ' ')
    if [ "$elp_lines" -ne 1 ]; then
        echo "$elp_lines lines on stderr, expected exactly one 'shardlm: error: ...' line"
        return
    fi
    elp_line=$(cat "$elp_file")
    case $elp_line in
    "shardlm: error: "*) ;;
    *)
        echo "stderr line does not start with 'shardlm: error: '"
        return
        ;;
    esac
    for elp_p in "$@"; do
        if ! printf '%s\n' "$elp_line" | grep -q -F -e "$elp_p"; then
            echo "error line does not name '$elp_p'"
            return
        fi
    done
}

# skip_test REASON...: ends the test as skipped, a prerequisite being absent here: the one
# line "SKIP: REASON" (which ./setup.sh check lists; where SHLM_TESTS_REQUIRE_ALL=1,
# tests/run_test.sh turns the skip into a failure), $work removed when there is one (unless
# $work_removed_on_exit says an EXIT trap does it), exit 77
skip_test() {
    echo "SKIP: $*"
    if [ -n "${work:-}" ] && [ -d "$work" ] && [ -z "${work_removed_on_exit:-}" ]; then
        rm -rf "$work"
    fi
    exit 77
}

# test_begin NAME PREFIX: starts the test's clock ($t_start), makes its work directory
# $work (under $TMPDIR, named PREFIX.XXXXXX) and says where it is, and zeroes the counts
# of failures that fail() raises and of parts skip_part() skips. NAME starts every message
# of fail(), skip_part() and prepare_corpus.
test_begin() {
    test_name=$1
    t_start=$(date +%s)
    work=$(mktemp -d "${TMPDIR:-/tmp}/$2.XXXXXX") || exit 99
    echo "$test_name: work directory $work"
    fails=0
    skips=0
    skip_why=
}

# skip_part REASON...: one part of the test cannot run here (a prerequisite of that part
# alone is absent): "NAME: SKIP: REASON", counted in $skips; test_end then ends a test
# that failed nothing as skipped, never as passed
skip_part() {
    echo "$test_name: SKIP: $*"
    skips=$((skips + 1))
    skip_why=${skip_why:+$skip_why; }$*
}

# fail MESSAGE...: reports one problem and counts it in $fails
fail() {
    echo "$test_name: FAIL: $*"
    fails=$((fails + 1))
}

# test_end: the verdict line with the test's time, then exit: 1 when fail() was called
# ($work kept for a look), else 77 (skip_test's line) when skip_part() was, else 0; $work
# is removed unless something failed or KEEP is set
test_end() {
    te_s=$(($(date +%s) - t_start))
    if [ "$fails" -ne 0 ]; then
        echo "$test_name: FAIL ($fails; $te_s s); work directory kept: $work"
        exit 1
    fi
    if [ "${skips:-0}" -ne 0 ]; then
        echo "$test_name: every part that ran passed ($te_s s); $skips skipped"
        skip_test "$skips part(s) not run: $skip_why"
    fi
    echo "$test_name: PASS ($te_s s)"
    [ -n "${KEEP:-}" ] || rm -rf "$work"
    exit 0
}

# run_expecting_error PATTERN... -- CMD...: prints and runs CMD (stdin /dev/null, stdout
# $work/out, stderr $work/err); sets $rc to its status and $why to what error_line_problem
# says of its stderr for the PATTERNs (fixed strings; empty: one line naming them all)
run_expecting_error() {
    ree_pats=
    while [ "$1" != "--" ]; do
        ree_pats="$ree_pats$1
"
        shift
    done
    shift
    echo "+ $*"
    "$@" >"$work/out" 2>"$work/err" </dev/null
    rc=$?
    ree_ifs=$IFS
    IFS='
'
    # shellcheck disable=SC2086 # one pattern a line
    why=$(error_line_problem "$work/err" $ree_pats)
    IFS=$ree_ifs
}

# prepare_corpus OUT: the bundled Shakespeare text as byte tokens in OUT (its log in
# $work/prepare.log); when that fails the test ends here (exit 1)
prepare_corpus() {
    if ! "$SHLM" data prepare --tokenizer bytes "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt" \
        "$1" >"$work/prepare.log" 2>&1; then
        cat "$work/prepare.log"
        echo "$test_name: FAIL: could not prepare the data"
        exit 1
    fi
}

# refused_before_step1 NAME RC: the run NAME (stderr in $work/NAME.err, run directory
# $work/NAME) exited with RC = 1 after one error line naming every further argument
# (fixed strings), having trained no step; counts a failure otherwise
refused_before_step1() {
    rbs_name=$1 rbs_rc=$2
    shift 2
    rbs_why=$(error_line_problem "$work/$rbs_name.err" "$@")
    if [ "$rbs_rc" -ne 1 ] || [ -n "$rbs_why" ]; then
        sed 's/^/    stderr: /' "$work/$rbs_name.err" | tail -n 5
        fail "$rbs_name: exit $rbs_rc (want 1) $rbs_why"
    elif [ -s "$work/$rbs_name/metrics.jsonl" ]; then
        fail "$rbs_name: trained $(wc -l <"$work/$rbs_name/metrics.jsonl") step(s) before refusing"
    else
        echo "$test_name: ok: $rbs_name: $(cat "$work/$rbs_name.err")"
    fi
}

# refused_on_ranks NAME RC PATTERN...: as refused_before_step1, for a run through the MPI
# launcher: RC is not 0 and stderr holds, beside the launcher's own report, one
# "shardlm: error:" line, naming every PATTERN (fixed strings)
refused_on_ranks() {
    ror_name=$1 ror_rc=$2
    shift 2
    ror_err=$(grep '^shardlm: error: ' "$work/$ror_name.err")
    ror_why=""
    [ "$ror_rc" -ne 0 ] || ror_why="exit 0"
    [ "$(grep -c '^shardlm: error: ' "$work/$ror_name.err")" -eq 1 ] ||
        ror_why="$ror_why; $(grep -c '^shardlm: error: ' "$work/$ror_name.err") error lines"
    for ror_p in "$@"; do
        printf '%s\n' "$ror_err" | grep -q -F -e "$ror_p" || ror_why="$ror_why; no '$ror_p'"
    done
    [ -s "$work/$ror_name/metrics.jsonl" ] && ror_why="$ror_why; trained a step"
    if [ -n "$ror_why" ]; then
        sed 's/^/    stderr: /' "$work/$ror_name.err" | head -n 5
        fail "$ror_name: $ror_why"
    else
        echo "$test_name: ok: $ror_name: $ror_err"
    fi
}

# find_h5py: sets $h5py to a python3 that has h5py and numpy (Debian: python3-h5py), or
# to "" when there is none
find_h5py() {
    h5py=""
    for fh_p in python3 /usr/bin/python3; do
        if command -v "$fh_p" >/dev/null 2>&1 && "$fh_p" -c 'import h5py, numpy' 2>/dev/null; then
            h5py=$fh_p
            return
        fi
    done
}

# lines DIR: logged steps so far (lines of DIR/metrics.jsonl)
lines() { [ -f "$1/metrics.jsonl" ] && wc -l <"$1/metrics.jsonl" || echo 0; }

# wait_step DIR N PID: until DIR's metrics.jsonl has N lines (0: a step more than now),
# while PID runs, 30 s at most; prints the count
wait_step() {
    want=$2
    [ "$want" -gt 0 ] || want=$(($(lines "$1") + 1))
    i=0
    while [ "$(lines "$1")" -lt "$want" ] && kill -0 "$3" 2>/dev/null && [ $i -lt 600 ]; do
        sleep 0.05
        i=$((i + 1))
    done
    lines "$1"
}

# skip_without_launcher RC: a status of 77 (tests/mpi_test.sh found no MPI launcher) ends
# the test as skipped, removing $work
skip_without_launcher() {
    if [ "$1" -eq 77 ]; then
        skip_test "no MPI launcher"
    fi
}

# skip_unless_launcher: ends the test as skipped where tests/mpi_test.sh finds no MPI
# launcher
skip_unless_launcher() {
    sh "$SHLM_SRCDIR/tests/mpi_test.sh" 1 true >/dev/null 2>&1
    skip_without_launcher $?
}

# step NAME CMD...: runs CMD (printed), its output in $work/NAME.log (the tail shown on
# failure, which fail() counts); returns its status (77 skips the test)
step() {
    st_name=$1
    shift
    echo "+ $*"
    "$@" >"$work/$st_name.log" 2>&1 </dev/null
    st_rc=$?
    skip_without_launcher $st_rc
    if [ $st_rc -ne 0 ]; then
        tail -n 15 "$work/$st_name.log"
        fail "$st_name exited with $st_rc"
    fi
    return $st_rc
}

# steps FILE KEY: "step value" of every line of the metrics.jsonl FILE (values as
# printed, %.9g: equal strings are equal numbers)
steps() {
    sed -n "s/.*\"step\": \([0-9]*\),.*\"$2\": \([^,}]*\).*/\1 \2/p" "$1"
}

# maxrel KEY REF RUN N: the largest |KEY - ref| / |ref| over the steps of two
# metrics.jsonl files (KEY: loss or grad_norm), or "missing" unless both hold the same N
# steps (a crash, a short run)
maxrel() {
    awk -v key="$1" -v want="$4" '
        function field(line, key,   s) {
            if (!match(line, "\"" key "\": [^,}]*")) return ""
            s = substr(line, RSTART, RLENGTH); sub(/^[^:]*: */, "", s); return s
        }
        FNR == NR { ref[field($0, "step")] = field($0, key); nref++; next }
        {
            s = field($0, "step"); n++
            if (!(s in ref) || ref[s] == "" || field($0, key) == "") { bad = 1; next }
            a = ref[s] + 0; b = field($0, key) + 0
            if (a != a || b != b) { bad = 1; next }   # nan
            d = a - b; if (d < 0) d = -d; if (a < 0) a = -a
            r = a > 0 ? d / a : d; if (r > m) m = r
        }
        END { if (bad || n != nref || n != want) print "missing"; else printf "%.3e\n", m }
    ' "$2" "$3" 2>/dev/null || echo missing
}

# train_on NAME NP ARGS...: `shardlm train ARGS` on NP ranks (tests/mpi_test.sh), the
# command printed, its output in $work/NAME.log; returns its exit status
train_on() {
    to_name=$1
    to_np=$2
    shift 2
    echo "+ sh tests/mpi_test.sh $to_np $SHLM train $*"
    sh "$SHLM_SRCDIR/tests/mpi_test.sh" "$to_np" "$SHLM" train "$@" >"$work/$to_name.log" 2>&1 </dev/null
}

# rows_maxrel REF RUN N: the largest relative difference of the values of the "step value"
# rows of file RUN to REF's of the same steps, or "missing" unless RUN holds N rows
rows_maxrel() {
    awk -v want="$3" '
        FNR == NR { ref[$1] = $2; next }
        { n++; a = ref[$1] + 0; b = $2 + 0; d = a - b; if (d < 0) d = -d
          if (a < 0) a = -a; r = d / a; if (r > m) m = r }
        END { if (n != want) print "missing"; else printf "%.3e\n", m }' "$1" "$2"
}

# follows RUN REF N TOL_LOSS TOL_NORM: run RUN's loss and gradient norm ($work/RUN/
# metrics.jsonl) within those relative tolerances of run REF's over N steps (no comparison
# when RUN is REF), and its loss lower by 0.1 at step N than at step 1; fails otherwise
follows() {
    if [ "$1" != "$2" ]; then
        for fl_key in loss grad_norm; do
            fl_tol=$4
            [ $fl_key = loss ] || fl_tol=$5
            fl_d=$(maxrel $fl_key "$work/$2/metrics.jsonl" "$work/$1/metrics.jsonl" "$3")
            if [ "$fl_d" = missing ] || awk -v d="$fl_d" -v t="$fl_tol" 'BEGIN { exit !(d > t) }'; then
                fail "$1: $fl_key differs from $2's by $fl_d relative (tolerance $fl_tol)"
            else
                echo "$test_name: ok: $1: $fl_key within $fl_d of $2's"
            fi
        done
    fi
    fl_first=$(steps "$work/$1/metrics.jsonl" loss | head -n 1 | cut -d' ' -f2)
    fl_last=$(steps "$work/$1/metrics.jsonl" loss | tail -n 1 | cut -d' ' -f2)
    awk -v a="$fl_first" -v b="$fl_last" 'BEGIN { exit !(b < a - 0.1) }' ||
        fail "$1: the loss did not fall ($fl_first at step 1, $fl_last at step $3)"
}

# lora_fingerprints RUN: the frozen base's fingerprint as run RUN loaded it and after its
# training (its log $work/RUN.log), space-separated
lora_fingerprints() {
    echo "$(sed -n 's/^lora: the frozen base (.*) has fingerprint \([0-9a-f]*\)$/\1/p' "$work/$1.log")" \
        "$(sed -n "s/^lora: the frozen base's fingerprint after training \([0-9a-f]*\) .*/\1/p" "$work/$1.log")"
}

# last_steps FILE KEY: "step value", the last value logged for each step (a run resumed
# from a checkpoint logs the steps after it again)
last_steps() {
    steps "$1" "$2" | awk '{ v[$1] = $2 } END { for (s in v) print s, v[s] }' | sort -n
}

# curves_problem REF RUN N: says how the loss or gradient norm of run RUN differs from
# run REF's (their metrics.jsonl in $work/REF and $work/RUN, the last value of each step,
# as printed: bit for bit), silent when both hold the same N steps with the same values
curves_problem() {
    for cp_key in loss grad_norm; do
        last_steps "$work/$1/metrics.jsonl" $cp_key >"$work/$1.$cp_key"
        last_steps "$work/$2/metrics.jsonl" $cp_key >"$work/$2.$cp_key"
        if [ "$(wc -l <"$work/$1.$cp_key")" -ne "$3" ] || ! cmp -s "$work/$1.$cp_key" "$work/$2.$cp_key"; then
            echo "the $cp_key of steps 1-$3 differs from $1's:" \
                "$(diff "$work/$1.$cp_key" "$work/$2.$cp_key" | head -n 5 | tr '\n' ' ')"
            return
        fi
    done
}

# sums_problem REF RUN: says how the checksums of the checkpoint `latest` names in the
# directory RUN differ from those in the directory REF (kept in $work/REF.sums and
# $work/RUN.sums with each path's slashes as dashes), silent when all are equal
sums_problem() {
    sp_ref=$work/$(echo "${1#"$work"/}" | tr / -).sums
    sp_run=$work/$(echo "${2#"$work"/}" | tr / -).sums
    "$SHLM" ckpt info "$1" 2>&1 | grep ' 0x' >"$sp_ref"
    "$SHLM" ckpt info "$2" 2>&1 | grep ' 0x' >"$sp_run"
    if [ ! -s "$sp_ref" ] || ! cmp -s "$sp_ref" "$sp_run"; then
        echo "the checkpoint's checksums differ from $1's:" \
            "$(diff "$sp_ref" "$sp_run" | head -n 4 | tr '\n' ' ')"
    fi
}
# "pid ppid comm" of every process, from /proc (procps may not be installed)
proc_table() {
    for f in /proc/[0-9]*/stat; do
        line=$(cat "$f" 2>/dev/null) || continue
        comm=${line#*\(}
        comm=${comm%\)*}
        # shellcheck disable=SC2086 # split the fields after "(comm) " on purpose
        set -- ${line##*\) }
        echo "${f#/proc/}" | sed "s|/stat\$| $2 $comm|"
    done
}

# descendants ROOT: "pid comm" of ROOT's descendants
descendants() {
    proc_table | awk -v root="$1" '
        { parent[$1] = $2; comm[$1] = $3 }
        END {
            for (p in parent) {
                q = p
                while (q in parent && q != root && q > 1) q = parent[q]
                if (q == root && p != root) print p, comm[p]
            }
        }'
}

# the launcher (mpirun, mpiexec, srun, ...) and the ranks under background job $1
launcher_pid() {
    descendants "$1" | awk '$2 ~ /^(mpirun|mpiexec|orterun|prterun|srun|mpiexec\.hydra)$/ { print $1; exit }'
}
rank_pids() {
    descendants "$1" | awk '$2 == "shardlm" { print $1 }' | sort -n
}

