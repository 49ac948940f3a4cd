#!/usr/bin/env bash
# Brings DIR up to date with the clone at /src (read-only in a chroot of
# test/majors/chroot.sh): the files git would commit, as they are in the work
# tree, listed by test/majors/test.sh in /src/.build/sources.list
# (NUL-separated); git itself may not work here (a worktree's repository is
# outside /src). A file gone from the clone goes from DIR too (a test, an
# SQL part); build outputs, never listed, stay.
#   test/majors/sync-sources.sh DIR
set -euo pipefail
list=/src/.build/sources.list
[ -f $list ] || { echo "sync-sources.sh: no $list (test/majors/test.sh writes it)" >&2; exit 2; }
build=$1 copied=$1.sources
mkdir -p "$build"
if [ -f "$copied" ]; then
  comm -23 <(tr '\0' '\n' <"$copied" | sort) <(tr '\0' '\n' <$list | sort) |
    while IFS= read -r gone; do rm -f "$build/$gone"; done
fi
rsync -a --from0 --files-from=$list /src/ "$build/"
cp $list "$copied"
