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
