#!/usr/bin/env bash
# Runs in a chroot of test/majors/chroot.sh: brings /build/billguard, where
# this major's objects stay between runs, up to date with the clone (at
# /src, read-only) and runs the command there, by default the whole suite.
#   test/majors/inside.sh [CMD...]
# The clone's files are the ones git would commit, as they are in the work
# tree, listed by test/majors/test.sh in .build/sources.list (NUL-separated):
# git itself may not work here (a worktree's repository is outside /src).
set -euo pipefail
[ -n "${BILLGUARD_IN_CHROOT:-}" ] || { echo "inside.sh: runs in a chroot (test/majors/chroot.sh run)" >&2; exit 2; }
list=/src/.build/sources.list
[ -f $list ] || { echo "inside.sh: no $list (test/majors/test.sh writes it)" >&2; exit 2; }
build=/build/billguard copied=/build/billguard.sources
mkdir -p $build
# A file gone from the clone goes from the copy too (a test, an SQL part);
# build outputs, never listed, stay.
if [ -f $copied ]; then
  comm -23 <(tr '\0' '\n' <$copied | sort) <(tr '\0' '\n' <$list | sort) |
    while IFS= read -r gone; do rm -f "$build/$gone"; done
fi
rsync -a --from0 --files-from=$list /src/ $build/
cp $list $copied
cd $build
[ $# -gt 0 ] || set -- test/run-all.sh
exec "$@"
