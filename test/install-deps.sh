#!/usr/bin/env bash
# Installs the Debian packages that building and testing billguard need.
# Quiet and quick when they are all present already.
set -euo pipefail
packages=(
  postgresql-15 postgresql-server-dev-15 postgresql-15-pgtap postgresql-15-auto-failover
  libtap-parser-sourcehandler-pgtap-perl libipc-run-perl
  libssl-dev libcurl4-openssl-dev libpqxx-dev nlohmann-json3-dev
  g++ make clang-14 llvm-14 clang-format curl
  openssl  # its command line signs the webhook tests' deliveries, independently of billguard
  prometheus wrk
  dpkg-dev bzip2 xz-utils  # apt-get source unpacks PostgreSQL's regression suite with dpkg-source
)
# The proxy's HTTP server is Boost.Beast and Asio (header-only): Debian's
# default Boost from trixie on; bookworm's default is 1.74, so its 1.81.
# shellcheck disable=SC1091
. /etc/os-release
if [ "${VERSION_CODENAME:-}" = bookworm ]; then packages+=(libboost1.81-dev); else packages+=(libboost-dev); fi
# The proxy's real-client test runs the official stripe package on Node.js.
command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
