#!/usr/bin/env bash
# `make bench`: bench/run.sh on every supported PostgreSQL major, one after
# the other (they share the machine's cores): 15 on this machine, 17 and 18
# in the Debian chroots of chroot.sh; then the figures side by side.
# `make bench PG=17` (or PG="15 18") runs those only.
#   test/majors/bench.sh [MAJOR...]
# Each major's whole output is kept in .build/bench-<major>.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=test/majors
host_major=15
[ $# -gt 0 ] || set -- 15 17 18
mkdir -p .build

load() { cut -d' ' -f1-3 /proc/loadavg; }
failed=0
for major in "$@"; do
  out=.build/bench-$major.txt
  echo "===== PostgreSQL $major (load before: $(load))" | tee "$out"
  t0=$SECONDS
  if [ "$major" = "$host_major" ]; then
    bench/run.sh 2>&1 | tee -a "$out" || failed=1
  else
    git ls-files -co --exclude-standard -z >.build/sources.list
    { $here/chroot.sh ensure "$major" && $here/chroot.sh run "$major" /src/$here/inside.sh bench/run.sh; } 2>&1 | tee -a "$out" || failed=1
  fi
  echo "bench: PostgreSQL $major took $((SECONDS - t0)) s, load after: $(load)" | tee -a "$out"
done

# The figures of each major's output, by the lines bench/*.sh print.
figure() {
  local file=$1 what=$2
  case $what in
    key) sed -n 's/^idempotency_key x [0-9]*: billguard \([0-9]*\) ms, SQL expression \([0-9]*\) ms.*/\1 \/ \2/p' "$file" ;;
    bill) sed -n 's/^bill_period over [0-9]* accounts: \([0-9]*\) ms; seed pre-flight insert: \([0-9]*\) ms/\1 \/ \2/p' "$file" ;;
    amounts) sed -n 's/^bill_period over [0-9]* accounts with period amounts: \([0-9]*\) ms; seed pre-flight insert: \([0-9]*\) ms/\1 \/ \2/p' "$file" ;;
    rerun) sed -n 's/^re-run (idempotent): bill_period \([0-9]*\) ms; seed insert \([0-9]*\) ms/\1 \/ \2/p' "$file" ;;
    i64) sed -n 's/^  max_inflight  64: *\([0-9.]*\) charges\/s.*/\1/p' "$file" ;;
    i200) sed -n 's/^  max_inflight 200: *\([0-9.]*\) charges\/s.*/\1/p' "$file" ;;
    cpu) sed -n 's/^  database CPU .* \([0-9]*\) us per charge.*/\1/p' "$file" ;;
    wal) sed -n 's/^  WAL \([0-9]*\) bytes per charge.*/\1/p' "$file" ;;
    load) sed -n 's/^===== .*load before: \([0-9.]*\).*/\1/p; s/^bench: .*load after: \([0-9.]*\).*/\1/p' "$file" | paste -sd'/' ;;
  esac
}
echo
echo "== bench per major (ms: billguard / baseline; charges/s; per charge)"
rows=("key:idempotency_key x 1M, ms (ours / SQL)"
  "bill:bill_period 1M accounts, ms (ours / seed insert)"
  "rerun:bill_period again, ms (ours / seed insert)"
  "amounts:bill_period 1M period amounts, ms (ours / seed insert)"
  "i64:dispatch 50 ms, 64 in flight, charges/s"
  "i200:dispatch 50 ms, 200 in flight, charges/s"
  "cpu:database CPU per charge, us"
  "wal:WAL per charge, bytes"
  "load:load average (1 min) before / after")
printf '%-52s' ""
for major in "$@"; do printf '%18s' "PostgreSQL $major"; done
echo
for row in "${rows[@]}"; do
  printf '%-52s' "${row#*:}"
  for major in "$@"; do printf '%18s' "$(figure ".build/bench-$major.txt" "${row%%:*}" | head -1)"; done
  echo
done
[ $failed -eq 0 ]
