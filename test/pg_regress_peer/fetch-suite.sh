#!/usr/bin/env bash
# Prints the directory holding PostgreSQL's regression suite for the
# installed server: src/test/regress of the Debian source package
# (`apt-get source postgresql-<major>`) with its C modules built against the
# installed headers. Kept in a cache outside the clone, one directory per
# installed Debian version, and reused while that version stays installed.
# The archive may no longer carry the source of the installed version (a
# mirror behind the security archive): then the newest source of the same
# major is used and SOURCE says which; the peer comparison runs the
# same tests on every server, so it does not depend on the two agreeing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

version_line=$(pg_config --version) # PostgreSQL 15.20 (Debian 15.20-0+deb12u1)
major=$(sed -E 's/^PostgreSQL ([0-9]+).*/\1/' <<<"$version_line")
installed=$(sed -nE 's/.*\(Debian ([^)]+)\).*/\1/p' <<<"$version_line")
[ -n "$installed" ] || { echo "fetch-suite: not a Debian build of PostgreSQL: $version_line" >&2; exit 1; }
package=postgresql-$major

if [ -n "${BILLGUARD_CACHE:-}" ]; then cache=$BILLGUARD_CACHE
elif [ "$(id -u)" = 0 ]; then cache=/var/cache/billguard
else cache=${XDG_CACHE_HOME:-$HOME/.cache}/billguard
fi
cache=$cache/pg-regress
suite=$cache/$installed
# The suite's directory appears whole (a rename) and SOURCE is in it.
[ -f "$suite/SOURCE" ] && { echo "$suite"; exit 0; }

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9 # two runs on one machine fetch once
[ -f "$suite/SOURCE" ] && { echo "$suite"; exit 0; }

tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# A private sources list: deb-src for every archive apt installs the package
# from, so the system's apt configuration and lists stay untouched.
apt-cache policy "$package" |
  awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[a-z]+:\/\// && $NF == "Packages" {
         split($3, sc, "/"); print "deb-src", $2, sc[1], sc[2] }' |
  sort -u >"$tmp/sources.list"
mkdir -p "$tmp/sources.list.d" "$tmp/lists/partial" "$tmp/apt-cache/archives/partial" "$tmp/src"
# A system whose package lists were cleaned after installing (the chroots
# of test/majors/chroot.sh) has no archive in apt-cache policy: then every
# archive its sources name, as deb-src.
if [ ! -s "$tmp/sources.list" ]; then
  { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true; } |
    sed -n 's/^deb /deb-src /p' | sort -u >"$tmp/sources.list"
  for f in /etc/apt/sources.list.d/*.sources; do
    if [ -f "$f" ]; then sed 's/^Types: *deb$/Types: deb-src/' "$f" >"$tmp/sources.list.d/${f##*/}"; fi
  done
fi
[ -s "$tmp/sources.list" ] || [ -n "$(ls "$tmp/sources.list.d")" ] ||
  { echo "fetch-suite: apt knows no archive for $package" >&2; exit 1; }
apt=(-o Dir::Etc::SourceList="$tmp/sources.list" -o Dir::Etc::SourceParts="$tmp/sources.list.d"
     -o Dir::State::Lists="$tmp/lists" -o Dir::Cache="$tmp/apt-cache" -o APT::Sandbox::User="$(id -un)")
echo "fetch-suite: apt-get source $package=$installed ($(cat "$tmp/sources.list" "$tmp/sources.list.d"/* 2>/dev/null | grep -E '^(deb-src|URIs|Suites)' | paste -sd, -))" >&2
apt-get "${apt[@]}" -qq update >&2
fetched=
for version in "$installed" $(apt-cache "${apt[@]}" showsrc "$package" | sed -n 's/^Version: //p' |
                              grep -vxF "$installed" | sort -Vru); do
  rm -rf "$tmp/src" && mkdir "$tmp/src"
  if (cd "$tmp/src" && apt-get "${apt[@]}" -qq source "$package=$version" >"$tmp/source.log" 2>&1); then
    fetched=$version
    break
  fi
  echo "fetch-suite: the archive does not serve the source of $package $version" >&2
done
# Exit 3: the archive lists sources of the major but serves none of them
# (a mirror without source packages): run-all.sh reports the suite skipped.
[ -n "$fetched" ] || { cat "$tmp/source.log" >&2; echo "fetch-suite: the archive serves no source of $package" >&2; exit 3; }
[ "$fetched" = "$installed" ] ||
  echo "fetch-suite: using the source of $fetched for the installed $installed" >&2
tree=$(find "$tmp/src" -mindepth 1 -maxdepth 1 -type d -name "$package-*")
regress=$tree/src/test/regress

mkdir -p "$tmp/suite/lib"
cp -a "$regress/sql" "$regress/expected" "$regress/data" "$regress/parallel_schedule" \
  "$regress/resultmap" "$tmp/suite/"
cp "$regress/regress.c" "$tree/contrib/spi/refint.c" "$tree/contrib/spi/autoinc.c" "$tmp/suite/lib/"
# No LLVM bitcode: the modules are loaded by path, never inlined by the JIT.
make -s -C "$tmp/suite/lib" -f "$here/modules.mk" with_llvm=no >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log" >&2; exit 1; }
echo "$package $(dpkg-parsechangelog -l "$tree/debian/changelog" -S Version)" >"$tmp/suite/SOURCE"
echo "$version_line" >"$tmp/suite/SERVER_VERSION"
chmod -R a+rX "$tmp/suite"
rm -rf "$suite" && mv "$tmp/suite" "$suite"
echo "$suite"
