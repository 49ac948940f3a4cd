#!/usr/bin/env bash
# Installs the Debian packages that building and testing billguard need, for
# the PostgreSQL major of this Debian suite: bookworm 15 (the host), trixie 17
# and forky 18 (the chroots of test/majors/chroot.sh, which run this script
# inside them). Quiet and quick when they are all present already.
set -euo pipefail
. /etc/os-release
suite=${VERSION_CODENAME:-}
# forky's os-release may name no codename while it is testing.
[ -z "$suite" ] && grep -q forky /etc/debian_version 2>/dev/null && suite=forky
# boost: the proxy's Beast and Asio, Debian's default Boost from trixie on;
# bookworm's default is 1.74, so its 1.81.
case $suite in
  bookworm) pg=15 previous=() boost=libboost1.81-dev style=(clang-format-14) ;;
  trixie) pg=17 previous=(15) boost=libboost-dev style=() ;;
  forky) pg=18 previous=(17) boost=libboost-dev style=() ;;
  *) echo "install-deps.sh: Debian $suite is not a suite billguard is tested on" >&2; exit 1 ;;
esac
packages=(
  "postgresql-$pg" "postgresql-server-dev-$pg" "postgresql-$pg-pgtap" "postgresql-$pg-auto-failover"
  # The major before, beside it, for pg_upgrade (test/majors/chroot.sh
  # configures the suite that carries it).
  "${previous[@]/#/postgresql-}" "${previous[@]/#/postgresql-server-dev-}"
  libtap-parser-sourcehandler-pgtap-perl libipc-run-perl
  libssl-dev libcurl4-openssl-dev libpqxx-dev nlohmann-json3-dev
  # The proxy's HTTP server, Boost.Beast and Asio (header-only).
  "$boost"
  g++ make curl procps
  # The style check is pinned to one clang-format and runs on the host only.
  "${style[@]}"
  openssl  # its command line signs the webhook tests' deliveries, independently of billguard
  prometheus wrk
  prometheus-postgres-exporter  # runs monitoring/postgres_exporter.yaml (test/t/198)
  dpkg-dev bzip2 xz-utils  # apt-get source unpacks PostgreSQL's regression suite with dpkg-source
)
# The proxy's real-client test runs the official stripe package on Node.js.
command -v npm >/dev/null || packages+=(nodejs npm)

missing() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"
  done
}
install() {
  [ $# -eq 0 ] && return 0
  echo "installing: $*"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
mapfile -t absent < <(missing "${packages[@]}")
install "${absent[@]}"

# PGXS compiles LLVM bitcode for JIT inlining with the clang and llvm-lto this
# major was built with: their version changes with the suite.
global=/usr/lib/postgresql/$pg/lib/pgxs/src/Makefile.global
llvm=$(sed -n 's|^LLVM_BINPATH = /usr/lib/llvm-\([0-9]*\)/bin$|\1|p' "$global")
if [ -n "$llvm" ]; then
  mapfile -t absent < <(missing "clang-$llvm" "llvm-$llvm")
  install "${absent[@]}"
fi
