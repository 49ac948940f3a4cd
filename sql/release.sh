#!/usr/bin/env bash
# Releases the SQL of the version under development (the Makefile's
# EXTVERSION) and moves development on:
#   sql/release.sh NEXT_VERSION
#   - sql/billguard--<version>.sql.in: the install as released, frozen:
#     sql/install/*.sql in name order, each include of latest.sql naming
#     the object's newest snapshot instead (the same text: check-sql's
#     first rule), so that the built script is the install of today, byte
#     for byte, with a first line saying so;
#   - sql/released.sha256: the sha256 of that install and of the upgrade
#     into <version>, as built;
#   - sql/billguard--<version>--<next>.sql.in: the upgrade to the next
#     version, no migration yet;
#   - EXTVERSION = <next> in the Makefile, the one version source of the
#     control file, META.json and the library.
# The snapshots <version>.sql stay as they are, frozen with the release;
# the next change to a function is a snapshot <next>.sql.
set -euo pipefail
cd "$(dirname "$0")/.."
next=${1:?usage: sql/release.sh NEXT_VERSION}
version=$(sed -n 's/^EXTVERSION *= *//p' Makefile)
[[ $next =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "release: $next is not X.Y.Z" >&2; exit 2; }
[ -e "sql/billguard--$version.sql.in" ] && { echo "release: $version is released already" >&2; exit 2; }
test/check-sql.pl

frozen=sql/billguard--$version.sql.in
upgrade=$(ls sql/billguard--*--"$version".sql.in)
{
  echo "-- billguard $version as released, frozen: written by sql/release.sh from sql/install/*.sql."
  for part in sql/install/*.sql; do
    while IFS= read -r line; do
      if [[ $line =~ ^\\ir\ \.\./((udfs|views)/[^/]+)/latest\.sql$ ]]; then
        object=${BASH_REMATCH[1]}
        newest=$(cd "sql/$object" && ls | grep -v '^latest\.sql$' | sort -V | tail -n 1)
        echo "\\ir $object/$newest"
      else
        printf '%s\n' "$line"
      fi
    done <"$part"
  done
} >"$frozen"

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
sql/assemble.pl -o "$build/released.sql" "$frozen"
sql/assemble.pl -o "$build/development.sql" sql/install/*.sql
sql/assemble.pl -o "$build/upgrade.sql" "$upgrade"
tail -n +2 "$build/released.sql" | cmp -s - "$build/development.sql" \
  || { echo "release: $frozen does not build the install of today" >&2; rm "$frozen"; exit 1; }
{
  (cd "$build" && sha256sum released.sql | sed "s/ released.sql\$/ billguard--$version.sql/")
  (cd "$build" && sha256sum upgrade.sql | sed "s/ upgrade.sql\$/ $(basename "$upgrade" .in)/")
} >>sql/released.sha256

cat >"sql/billguard--$version--$next.sql.in" <<EOF
-- billguard $version -> $next, run by ALTER EXTENSION billguard UPDATE; built
-- into sql/billguard--$version--$next.sql by sql/assemble.pl.
-- What goes here, in the order of the install's files, each section headed
-- by what changed for a user:
--   - "\\ir udfs/<name>/$next.sql" (views/ for a view), once for each
--     function or view new or changed in $next: sql/udfs/<name>/$next.sql
--     is the text of its latest.sql (test/check-sql.pl holds them equal);
--   - the migration those definitions cannot make: refusals of data $next
--     rejects, first; table changes (new columns in the order of the
--     install's, without a default a fresh install lacks), backfills,
--     triggers, pg_extension_config_dump of new tables; DROP FUNCTION of a
--     function gone, or before one whose result or arguments change is
--     created again (renamed first if users may hold grants on it, then
--     carried over, as the upgrade to 0.2.0 does);
--   - REVOKE ALL ... FROM PUBLIC on each new function, table and view, as a
--     fresh install's sql/install/90_privileges.sql does; never on an
--     existing one, which would take users' grants out of pg_dump.
-- test/t/080_upgrade.pl proves that a database updated to $next is a fresh $next.
\\echo Use "ALTER EXTENSION billguard UPDATE TO '$next'" to load this file. \\quit
EOF
sed -i "s/^EXTVERSION *= *$version\$/EXTVERSION = $next/" Makefile
test/check-sql.pl
echo "released $version: $frozen, sql/released.sha256; development moves to $next"
