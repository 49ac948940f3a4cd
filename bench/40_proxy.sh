#!/usr/bin/env bash
# billguard-proxy against a zero-latency Stripe emulator, on a cluster of its
# own, with wrk as the client (every request a new 50-cent charge):
#  - the latency the proxy adds: p50 and p99 through the proxy minus direct
#    to the emulator, at 1, 16 and 64 concurrent clients (target: p50 added
#    <= 1 ms at 1 client);
#  - authorized charges per second through the proxy, all on one budget, so
#    every request contends on one cap (target >= 1,500/s on 2 cores).
set -euo pipefail
source bench/lib.sh proxy
seconds=${BENCH_PROXY_SECONDS:-5}

start_emulator
start_cluster "shared_buffers = 512MB" "max_wal_size = 4GB"
sql -c "CREATE EXTENSION billguard"
write_secret "$dir/stripe.key" sk_test_billguardEmulatorHarness0001
write_secret "$dir/admin.token" "$(head -c 32 /dev/urandom | base64)"
start_proxy postgres --upstream "$emulator" --upstream-key-file "$dir/stripe.key" --admin-token-file "$dir/admin.token"
vault_key=$(curl -s -X POST "$proxy/keys" -H "Authorization: Bearer $(cat "$dir/admin.token")" \
  -d '{"vendor":"stripe","billing_period":"2030-01","period_usd_cap":100000000,
       "allowed_endpoints":["/v1/payment_intents"],"expires_at":"2099-01-01T00:00:00Z"}' |
  sed 's/.*"vault_key":"\([^"]*\)".*/\1/')

# wrk at $1 connections against $2 with key $3; prints "p50_ms p99_ms requests_per_s non_2xx".
run=0
measure() {
  local connections=$1 url=$2 key=$3 threads=2 out
  [ "$connections" -lt 2 ] && threads=1
  run=$((run + 1))
  out=$(BENCH_KEY=$key BENCH_RUN="r$run-$RANDOM" wrk -t "$threads" -c "$connections" -d "${seconds}s" \
    --latency -s bench/proxy_charges.lua "$url")
  awk '
    function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
    $1 == "50%" { p50 = ms($2) } $1 == "99%" { p99 = ms($2) }
    /^Requests\/sec:/ { rps = $2 } /Non-2xx/ { bad = $NF }
    END { printf "%.3f %.3f %.0f %d\n", p50, p99, rps, bad }' <<<"$out"
}

echo "latency the proxy adds (wrk, ${seconds}s each, zero-latency emulator):"
for connections in 1 16 64; do
  read -r dp50 dp99 drps dbad <<<"$(measure "$connections" "$emulator" sk_test_billguardEmulatorHarness0001)"
  read -r pp50 pp99 prps pbad <<<"$(measure "$connections" "$proxy" "$vault_key")"
  awk -v c="$connections" -v dp50="$dp50" -v dp99="$dp99" -v pp50="$pp50" -v pp99="$pp99" \
      -v bad=$((dbad + pbad)) 'BEGIN {
    printf "  %2d clients: direct p50 %.2f ms p99 %.2f ms; proxy p50 %.2f ms p99 %.2f ms; added p50 %.2f ms, p99 %.2f ms%s%s\n",
           c, dp50, dp99, pp50, pp99, pp50 - dp50, pp99 - dp99,
           c == 1 ? " (target p50 added <= 1 ms)" : "", bad ? sprintf(" (%d non-2xx!)", bad) : "" }'
done

echo "authorized charges per second on one budget (64 clients):"
read -r _ _ drps dbad <<<"$(measure 64 "$emulator" sk_test_billguardEmulatorHarness0001)"
read -r _ _ prps pbad <<<"$(measure 64 "$proxy" "$vault_key")"
awk -v d="$drps" -v p="$prps" -v bad=$((dbad + pbad)) 'BEGIN {
  printf "  through the proxy %.0f/s (target >= 1500/s); direct to the emulator %.0f/s; ratio %.2f%s\n",
         p, d, p / d, bad ? sprintf(" (%d non-2xx!)", bad) : "" }'
sql -c "
  SELECT format('  the budget: %s charges settled, %s cents, %s reserved',
                (SELECT count(*) FROM billguard.vault_reservations WHERE status = 'settled'),
                settled_cents, reserved_cents) FROM billguard.vault_spend"
