#!/usr/bin/env bash
# The dispatcher billing a period through billguard-proxy vs direct to the
# emulator, at 50 ms upstream latency, on a cluster of its own (the proxy's
# ledger in a database of its own there, as deployed): 3,000 charges per
# period, rate limit high, at max_inflight 16 (the default) and 64; each way
# twice, alternating, charges per second measured in the billing database
# (first claim to last completion). Prints the ratio through / direct
# (target >= 0.95) for each, and the proxy's mean upstream time, which tells
# its own cost from the emulator's.
# BENCH_PROXY_BILLING_CHARGES (3000) and BENCH_PROXY_ARGS (more proxy flags,
# e.g. --database-pool 16) vary it.
set -euo pipefail
source bench/lib.sh proxy-billing
charges=${BENCH_PROXY_BILLING_CHARGES:-3000}

start_emulator --latency-ms 50

# The secrets: the Stripe key for the dispatcher (direct) and for the proxy,
# the proxy's tokens, and the issuer token again for the dispatcher. Each
# file is owned by the process that reads it.
issuer_token=$(head -c 32 /dev/urandom | base64)
write_secret "$dir/stripe.key" sk_test_billguardEmulatorHarness0001
write_secret "$dir/proxy-stripe.key" sk_test_billguardEmulatorHarness0001
write_secret "$dir/admin.token" "$(head -c 32 /dev/urandom | base64)"
write_secret "$dir/issuer.token" "$issuer_token"
write_secret "$dir/dispatcher-issuer.token" "$issuer_token"
[ "$(id -u)" = 0 ] && chown postgres "$dir/stripe.key" "$dir/dispatcher-issuer.token"

start_cluster \
  "billguard.database = 'postgres'" "billguard.api_base = '$emulator'" \
  "billguard.api_key_file = '$dir/stripe.key'" "billguard.poll_interval = '1s'" \
  "billguard.max_requests_per_second = 100000" \
  "shared_buffers = 512MB" "max_wal_size = 4GB"
sql -c "CREATE EXTENSION billguard" -c "CREATE DATABASE vault"
sql_in vault -c "CREATE EXTENSION billguard"
sql -c "INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, payment_method)
        SELECT 'cust_' || lpad(g::text, 6, '0'), 'cus_' || g, 1000, 'pm_card_visa'
          FROM generate_series(1, $charges) g"

# The periods billed below are years ahead: the issuer token's bounds on
# periods and key lives are widened for them.
start_proxy vault --upstream "$emulator" --upstream-key-file "$dir/proxy-stripe.key" \
  --admin-token-file "$dir/admin.token" --issuer-token-file "$dir/issuer.token" \
  --issuer-max-period-usd 100000000 --issuer-period-months 1200 --issuer-max-key-days 36500 \
  ${BENCH_PROXY_ARGS:-}

direct() {
  sql -c "ALTER SYSTEM SET billguard.api_base = '$emulator'" \
      -c "ALTER SYSTEM RESET billguard.vault_issuer_token_file" -c "SELECT pg_reload_conf()" >/dev/null
  sleep 0.5
}
through_proxy() {
  sql -c "ALTER SYSTEM SET billguard.api_base = '$proxy'" \
      -c "ALTER SYSTEM SET billguard.vault_issuer_token_file = '$dir/dispatcher-issuer.token'" \
      -c "SELECT pg_reload_conf()" >/dev/null
  sleep 0.5
}
# Bills period $1 and waits until all settled; prints charges per second.
run_period() {
  local period=$1
  sql -c "SELECT initiated FROM billguard.bill_period('$period')" >/dev/null
  settle_rate "$period"
}

echo "the dispatcher through the proxy vs direct, 50 ms upstream latency, $charges charges a period:"
year=2032
for inflight in 16 64; do
  sql -c "ALTER SYSTEM SET billguard.max_inflight = $inflight" -c "SELECT pg_reload_conf()" >/dev/null
  d1=$(direct; run_period $year-01)
  p1=$(through_proxy; run_period $year-02)
  d2=$(direct; run_period $year-03)
  p2=$(through_proxy; run_period $year-04)
  keys=$(sql_in vault \
    -c "SELECT count(*) FROM billguard.vault_keys WHERE billing_period IN ('$year-02', '$year-04')")
  year=$((year + 1))
  awk -v i="$inflight" -v d1="$d1" -v d2="$d2" -v p1="$p1" -v p2="$p2" -v keys="$keys" 'BEGIN {
    d = (d1 + d2) / 2; p = (p1 + p2) / 2
    printf "  max_inflight %2d%s: direct %.1f and %.1f charges/s; through the proxy %.1f and %.1f charges/s (%d vault keys); through / direct %.3f (target >= 0.95)\n",
           i, i == 16 ? " (the default)" : "", d1, d2, p1, p2, keys, p / d }'
done
curl -s "$proxy/metrics" | awk '
  /^billguard_proxy_upstream_seconds_sum/ { sum = $2 } /^billguard_proxy_upstream_seconds_count/ { n = $2 }
  END { if (n) printf "  (the proxy waited %.1f ms for the emulator per request on average)\n", sum / n * 1000 }'
