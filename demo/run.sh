#!/usr/bin/env bash
# `make demo`: a throwaway cluster with billguard preloaded and the Stripe
# emulator; 1,000 demo accounts billed end to end for 2026-08, then a second
# period with a crash in the middle, each proven at the emulator: exactly one
# charge per account.
set -euo pipefail
cd "$(dirname "$0")/.."

source test/prepare.sh demo
emulator_pid=
cleanup() {
  test/cluster.sh stop "$work/pg" immediate 2>/dev/null || true
  [ -n "$emulator_pid" ] && kill "$emulator_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The emulator answers like Stripe, 20 ms per request.
tools/stripe-emulator/billguard-stripe-emulator --listen 127.0.0.1:0 --latency-ms 20 --quiet \
  >"$work/emulator.out" 2>"$work/emulator.log" &
emulator_pid=$!
for _ in $(seq 50); do grep -q listening "$work/emulator.out" && break; sleep 0.1; done
emulator=http://$(sed -n 's/^listening on //p' "$work/emulator.out")

mkdir -p "$work/pg"
echo "sk_test_billguard_demo_key" >"$work/stripe.key"
chmod 600 "$work/stripe.key"
[ "$(id -u)" = 0 ] && chown postgres "$work/stripe.key"
test/cluster.sh start "$work/pg" "$port" \
  "billguard.database = 'postgres'" \
  "billguard.api_base = '$emulator'" \
  "billguard.api_key_file = '$work/stripe.key'" \
  "billguard.max_requests_per_second = 100" \
  "billguard.max_inflight = 16"
sql() { psql -X -q -h "$work/pg" -p "$port" -U postgres -d postgres "$@"; }
value() { sql -At -c "$1"; }

echo "== a throwaway cluster on port $port with billguard preloaded; the Stripe emulator at $emulator"
sql -c "CREATE EXTENSION billguard"
sql -c "INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
        SELECT 'cust_' || lpad(g::text, 4, '0'), 'cus_demo' || g, 1000 + (g % 10) * 100, 'usd', 'pm_card_visa'
          FROM generate_series(1, 1000) g"
echo "1,000 demo accounts loaded (paced at 100 requests/s, Stripe's live-mode limit)"

# Prints a progress bar until no record of the period is open.
# The rate counts only what settled since the bar started (after a crash,
# the records settled before it are not this run's work).
progress() {
  local period=$1 started now done total rate eta bar first=
  started=$(date +%s.%N)
  while :; do
    read -r done total < <(value "SELECT count(*) FILTER (WHERE status NOT IN ('pending','dispatching','unknown')), count(*)
                                    FROM billguard.billing_records WHERE billing_period = '$period'" | tr '|' ' ')
    now=$(date +%s.%N)
    first=${first:-$done}
    read -r rate eta bar < <(awk -v d="$done" -v f="$first" -v t="$total" -v s="$started" -v n="$now" 'BEGIN {
      el = n - s; r = el > 0 ? (d - f) / el : 0; eta = r > 0 ? (t - d) / r : 0
      w = int(40 * d / (t > 0 ? t : 1)); b = ""; for (i = 0; i < 40; i++) b = b (i < w ? "#" : ".")
      printf "%.1f %.1f %s\n", r, eta, b }')
    printf '\r  [%s] %4d/%d settled  %6.1f charges/s  ETA %5.1fs ' "$bar" "$done" "$total" "$rate" "$eta"
    [ "$done" = "$total" ] && break
    sleep 0.3
  done
  echo
}

# One successful charge per (customer, period) at the emulator, each the one
# its billing record holds.
proof() {
  local period=$1
  curl -s "$emulator/_emulator/ledger" >"$work/ledger.json"
  chmod 644 "$work/ledger.json"
  sql -v period="$period" -v ledger="$work/ledger.json" <<'SQL'
WITH charges AS (
  SELECT o ->> 'id' AS id, o -> 'metadata' ->> 'billguard_key' AS key
    FROM jsonb_array_elements(pg_read_file(:'ledger')::jsonb) o
   WHERE o ->> 'status' = 'succeeded' AND o -> 'metadata' ->> 'billing_period' = :'period')
SELECT :'period' AS billing_period,
       (SELECT count(*) FROM charges) AS charges_at_stripe,
       (SELECT count(DISTINCT key) FROM charges) AS distinct_keys,
       (SELECT count(*) FROM billguard.billing_records r
          JOIN charges c ON c.key = r.idempotency_key AND c.id = r.charge_id
         WHERE r.status = 'completed') AS records_matching_their_charge;
SQL
}

echo
echo "== SELECT * FROM billguard.bill_period('2026-08')"
sql -c "SELECT * FROM billguard.bill_period('2026-08')"
progress 2026-08
sql -c "SELECT * FROM billguard.period_status('2026-08') WHERE count > 0"
proof 2026-08

echo "== the same call again (a re-fired scheduler): nothing is initiated, nothing is sent"
before=$(curl -s "$emulator/_emulator/stats" | sed 's/.*"requests":\([0-9]*\).*/\1/')
sql -c "SELECT * FROM billguard.bill_period('2026-08')"
sleep 1.5
after=$(curl -s "$emulator/_emulator/stats" | sed 's/.*"requests":\([0-9]*\).*/\1/')
echo "requests at the emulator before: $before, after: $after"

echo
echo "== 2026-09, and kill -9 the dispatcher half-way (the postmaster crash-restarts the cluster)"
sql -c "SELECT * FROM billguard.bill_period('2026-09')"
while [ "$(value "SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2026-09' AND status = 'completed'")" -lt 400 ]; do
  sleep 0.1
done
pid=$(value "SELECT pid FROM pg_stat_activity WHERE backend_type = 'billguard dispatcher'")
echo "killing dispatcher pid $pid with $(value "SELECT in_flight FROM billguard.dispatch_status") requests in flight"
kill -9 "$pid"
sleep 1
until value "SELECT 1" >/dev/null 2>&1; do sleep 0.2; done
echo "cluster back; records left 'dispatching' are re-sent with their stored key"
progress 2026-09
sql -c "SELECT * FROM billguard.period_status('2026-09') WHERE count > 0"
proof 2026-09
sql -c "SELECT event_type, count(*) FROM billguard.journal GROUP BY 1 ORDER BY 1"
sql -c "SELECT count(*) AS replayed_completions FROM billguard.journal
         WHERE event_type = 'BillingCompleted' AND (event ->> 'replayed')::boolean"
