#!/usr/bin/env bash
# Builds and installs billguard, from the tree it runs in, for the major
# before this chroot's, which the chroot carries beside its own
# (test/majors/chroot.sh): test/t/197_pg_upgrade_across_majors.pl upgrades
# a cluster of that major to this one. Its objects stay in
# /build/billguard-<major> between runs. The extension alone: the proxy and
# the emulator depend on no major (this major's build installed them).
#   test/majors/previous-major.sh
set -euo pipefail
[ -n "${BILLGUARD_IN_CHROOT:-}" ] || { echo "previous-major.sh: runs in a chroot (test/majors/chroot.sh run)" >&2; exit 2; }
new=$(pg_config --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
old=$(ls /usr/lib/postgresql | sort -n | awk -v n="$new" '$1 < n' | tail -1)
[ -n "$old" ] && [ -x "/usr/lib/postgresql/$old/bin/pg_config" ] || {
  echo "previous-major.sh: no PostgreSQL major before $new with its server headers here"
  exit 0
}
build=/build/billguard-$old
/src/test/majors/sync-sources.sh "$build"
cd "$build"
settings=(PG_CONFIG="/usr/lib/postgresql/$old/bin/pg_config" EXTENSION_ONLY=1)
make -s "${settings[@]}"
make -s "${settings[@]}" install
echo "billguard $(sed -n "s/^default_version = '\(.*\)'/\1/p" billguard.control) installed for PostgreSQL $old"
