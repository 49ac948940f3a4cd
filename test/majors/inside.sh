#!/usr/bin/env bash
# Runs in a chroot of test/majors/chroot.sh: copies the clone (at /src,
# read-only) to /build/billguard, where this major's objects stay between
# runs, and runs the command there, by default the whole suite.
#   test/majors/inside.sh [CMD...]
set -euo pipefail
[ -n "${BILLGUARD_IN_CHROOT:-}" ] || { echo "inside.sh: runs in a chroot (test/majors/chroot.sh run)" >&2; exit 2; }
mkdir -p /build/billguard
# What git would commit, as it is in the work tree; build outputs (ignored)
# stay in /build between runs, so make rebuilds only what changed.
rsync -a --delete --exclude=.git --filter=':- .gitignore' /src/ /build/billguard/
cd /build/billguard
[ $# -gt 0 ] || set -- test/run-all.sh
exec "$@"
