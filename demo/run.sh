#!/usr/bin/env bash
# `make demo`: a throwaway cluster with billguard preloaded, 1,000 demo
# accounts, and a real billing period run twice to show it is idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

source test/prepare.sh demo
trap 'test/cluster.sh stop "$work/pg" immediate 2>/dev/null || true; rm -rf "$work"' EXIT
test/cluster.sh start "$work/pg" "$port"
sql() { psql -X -q -h "$work/pg" -p "$port" -U postgres -d postgres "$@"; }

echo "== a throwaway cluster on port $port with billguard preloaded"
sql -c "CREATE EXTENSION billguard"
sql -c "INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
        SELECT 'cust_' || lpad(g::text, 4, '0'), 'cus_demo' || g, 1000 + (g % 10) * 100, 'usd', 'pm_card_visa'
          FROM generate_series(1, 1000) g"
echo "1,000 demo accounts loaded"

echo
echo "== SELECT * FROM billguard.bill_period('2026-08')   -- first call claims every account"
sql -c "SELECT * FROM billguard.bill_period('2026-08')"
echo "== the same call again (a re-fired scheduler): nothing new is initiated"
sql -c "SELECT * FROM billguard.bill_period('2026-08')"
echo "== a retried request for one customer gets the same key, in progress"
sql -c "SELECT * FROM billguard.bill_customer('cust_0001', '2026-08', 'retry-42')"
echo "== SELECT * FROM billguard.period_status('2026-08')"
sql -c "SELECT * FROM billguard.period_status('2026-08')"
echo "== the journal: one BillingInitiated per account, one BillingTickIssued"
sql -c "SELECT event_type, count(*) FROM billguard.journal GROUP BY 1 ORDER BY 1"
