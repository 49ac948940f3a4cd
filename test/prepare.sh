# Sourced by test/run-all.sh, demo/run.sh and bench/run.sh: install
# dependencies (as root), build and install billguard, and provide a work
# directory and a port for throwaway clusters. Sets $work and $port.
[ "$(id -u)" = 0 ] && test/install-deps.sh
export PATH="$(pg_config --bindir):$PATH"
make -s
[ "$(id -u)" = 0 ] && make -s install
work=$(mktemp -d "/tmp/billguard-$1.XXXXXX")
chmod 755 "$work"
port=${BILLGUARD_PORT:-$((20000 + RANDOM % 20000))}
