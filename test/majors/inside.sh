#!/usr/bin/env bash
# Runs in a chroot of test/majors/chroot.sh: brings /build/billguard, where
# this major's objects stay between runs, up to date with the clone (at
# /src, read-only; test/majors/sync-sources.sh) and runs the command there,
# by default the whole suite.
#   test/majors/inside.sh [CMD...]
set -euo pipefail
[ -n "${BILLGUARD_IN_CHROOT:-}" ] || { echo "inside.sh: runs in a chroot (test/majors/chroot.sh run)" >&2; exit 2; }
build=/build/billguard
/src/test/majors/sync-sources.sh $build
cd $build
[ $# -gt 0 ] || set -- test/run-all.sh
exec "$@"
