#!/usr/bin/env bash
# billguard.idempotency_key() vs the same key as a plain SQL expression,
# 1,000,000 calls each, best of 3. "net" subtracts what both share:
# generating the rows and the customer ids.
set -euo pipefail
n=1000000
best_ms() { $BENCH_PSQL -c "SELECT round(min(bench_ms(\$q\$$1\$q\$))::numeric, 1) FROM generate_series(1, 3)"; }

ours=$(best_ms "SELECT count(billguard.idempotency_key('cust_' || g, '2026-08', 'akka-billing')) FROM generate_series(1, $n) g")
plain=$(best_ms "SELECT count(left(encode(sha256(convert_to('cust_' || g || ':' || '2026-08' || ':' || 'akka-billing', 'UTF8')), 'hex'), 32)) FROM generate_series(1, $n) g")
shared=$(best_ms "SELECT count('cust_' || g) FROM generate_series(1, $n) g")

awk -v o="$ours" -v p="$plain" -v s="$shared" -v n="$n" 'BEGIN {
  printf "idempotency_key x %d: billguard %.0f ms, SQL expression %.0f ms, shared row generation %.0f ms\n", n, o, p, s
  printf "  ratio: %.2fx faster (net of shared work: %.2fx; target >= 3x)\n", p / o, (p - s) / (o - s)
}'
