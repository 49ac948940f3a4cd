#!/usr/bin/env bash
# `make bench`: every benchmark runs beside its baseline on the same
# throwaway cluster in the same run, and prints the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."

source test/prepare.sh bench
trap 'test/cluster.sh stop "$work/pg" immediate 2>/dev/null || true; rm -rf "$work"' EXIT
test/cluster.sh start "$work/pg" "$port" \
  "shared_buffers = 1GB" "max_wal_size = 8GB" "checkpoint_timeout = 30min" "work_mem = 64MB"
export BENCH_PSQL="psql -X -q -At -h $work/pg -p $port -U postgres -d postgres"
$BENCH_PSQL -c "CREATE EXTENSION billguard" -f bench/timing.sql

for b in bench/[0-9]*.sh; do
  echo "== $(basename "$b" .sh)"
  bash "$b"
done
