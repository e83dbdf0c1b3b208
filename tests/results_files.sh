#!/bin/sh
# benchmarks/RESULTS.md and benchmarks/results/ agree: every file kept under results/ is
# named by a table of RESULTS.md (what no table cites goes: git keeps it), and every
# results/NAME that RESULTS.md names exists ({a,b} lists included). By hand:
#   SHLM_SRCDIR=SRC sh SRC/tests/results_files.sh
set -u
cd "$SHLM_SRCDIR/benchmarks" || exit 99
fails=0
named=$(grep -o 'results/[A-Za-z0-9_.{},-]*' RESULTS.md | sed 's|^results/||; s/[.,]*$//' | sort -u |
    while read -r n; do
        case $n in
        *"{"*"}"*) # one brace list: a{b,c}d -> abd acd
            pre=${n%%\{*} rest=${n#*\{} list=${rest%%\}*} post=${rest#*\}}
            for x in $(echo "$list" | tr ',' ' '); do echo "$pre$x$post"; done ;;
        *) echo "$n" ;;
        esac
    done | sort -u)
for n in $named; do
    [ -f "results/$n" ] || { echo "results_files: FAIL: RESULTS.md names results/$n, which is not there"; fails=$((fails + 1)); }
done
for f in results/*; do
    [ -e "$f" ] || continue
    printf '%s\n' "$named" | grep -qxF "${f#results/}" ||
        { echo "results_files: FAIL: $f is named by no table of RESULTS.md"; fails=$((fails + 1)); }
done
[ $fails -eq 0 ] || exit 1
echo "results_files: PASS ($(printf '%s\n' "$named" | grep -c .) files, each named by RESULTS.md)"
