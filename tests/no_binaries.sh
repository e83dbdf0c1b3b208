#!/bin/sh
# The repository holds sources, not what they build: no file git tracks is a built binary
# (an ELF executable, library or object, or an ar archive: the first bytes say), and no
# built binary lying in the checkout (a `make` here, or a test program compiled by hand)
# is one that `git add -A` would pick up, which .gitignore's patterns for tests/,
# tests/gpu/ and benchmarks/ prevent. Fails naming each file. Needs a git checkout (a
# release tarball has no index: skipped). By hand:
#   SHLM_SRCDIR=SRC sh SRC/tests/no_binaries.sh
set -u
. "$SHLM_SRCDIR/tests/lib.sh"
cd "$SHLM_SRCDIR" || exit 99
command -v git >/dev/null 2>&1 || skip_test "no git to list the tracked files"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || skip_test "$SHLM_SRCDIR is not a git checkout"

# binary_kind FILE: "ELF" or "ar archive" from the first bytes of FILE, else nothing
binary_kind() {
    case $(od -An -N8 -c "$1" 2>/dev/null | tr -d ' ') in
    177ELF*) echo ELF ;;
    '!<arch>\n') echo "ar archive" ;;
    esac
}

fails=0
n=0
# tracked files (in the index), then files no .gitignore pattern covers
for set in tracked untracked; do
    if [ $set = tracked ]; then
        echo "+ git ls-files"
        list=$(git ls-files)
    else
        echo "+ git ls-files --others --exclude-standard"
        list=$(git ls-files --others --exclude-standard)
    fi
    while IFS= read -r f; do
        [ -f "$f" ] || continue
        n=$((n + 1))
        kind=$(binary_kind "$f")
        [ -n "$kind" ] || continue
        if [ $set = tracked ]; then
            echo "no_binaries: FAIL: $f is committed and is a built binary ($kind): git rm it"
        else
            echo "no_binaries: FAIL: $f is a built binary ($kind) that no .gitignore pattern covers"
        fi
        fails=$((fails + 1))
    done <<EOF
$list
EOF
done
[ $fails -eq 0 ] || exit 1
echo "no_binaries: PASS ($n files, none a built binary left to git)"
