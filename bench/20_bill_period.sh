#!/usr/bin/env bash
# bill_period over 1,000,000 accounts vs the seed's bare pre-flight insert
# of the same rows into a table with the seed's schema, then both re-run
# (the idempotent case); then over the same accounts when every one has a
# period amount (its own amount, currency, description and metadata) vs
# the same bare insert. Each measured on two periods; the better one counts.
# BENCH_ACCOUNTS sets another number of accounts (a quick run on a busy
# machine); the figures compared are those of 1,000,000.
set -euo pipefail
n=${BENCH_ACCOUNTS:-1000000}
$BENCH_PSQL <<SQL
CREATE TABLE seed_billing_records (
    customer_id      TEXT NOT NULL,
    billing_period   TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'pending',
    charge_id        TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT seed_billing_records_pk PRIMARY KEY (idempotency_key),
    CONSTRAINT seed_billing_records_uq UNIQUE (customer_id, billing_period)
);
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
SELECT 'cust_' || lpad(g::text, 7, '0'), 'cus_' || g, 1000 + g % 900, 'usd', 'pm_card_visa'
  FROM generate_series(1, $n) g;
VACUUM ANALYZE;
CHECKPOINT;
SQL

baseline_sql() {
  echo "INSERT INTO seed_billing_records (customer_id, billing_period, idempotency_key)
        SELECT customer_id, '$1', billguard.idempotency_key(customer_id, '$1', 'akka-billing')
          FROM billguard.accounts WHERE active
        ON CONFLICT (customer_id, billing_period) DO NOTHING"
}
ours_sql() { echo "SELECT * FROM billguard.bill_period('$1')"; }
time_ms() { $BENCH_PSQL -c "CHECKPOINT" -c "SELECT round(bench_ms(\$q\$$1\$q\$)::numeric, 0)"; }

for period in 2026-08 2026-09; do
  base_first+=("$(time_ms "$(baseline_sql $period)")")
  ours_first+=("$(time_ms "$(ours_sql $period)")")
  base_again+=("$(time_ms "$(baseline_sql $period)")")
  ours_again+=("$(time_ms "$(ours_sql $period)")")
done
# Every account metered for the next two periods, in two currencies, as
# the application's metering writes it (through the freeze's trigger).
$BENCH_PSQL <<SQL
INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, description, metadata)
SELECT a.customer_id, p.period, 500 + (hashtext(a.customer_id || p.period) & 65535),
       CASE WHEN right(a.customer_id, 1) < '5' THEN 'usd' ELSE 'eur' END,
       'usage of ' || a.customer_id || ' in ' || p.period,
       jsonb_build_object('plan', 'usage', 'meter', 'bench')
  FROM billguard.accounts a, (VALUES ('2026-10'), ('2026-11')) p (period);
VACUUM ANALYZE;
CHECKPOINT;
SQL
for period in 2026-10 2026-11; do
  base_amounts+=("$(time_ms "$(baseline_sql $period)")")
  ours_amounts+=("$(time_ms "$(ours_sql $period)")")
done
check=$($BENCH_PSQL -c "SELECT count(*) FROM billguard.billing_records")
[ "$check" = $((4 * n)) ] || { echo "expected $((4 * n)) records, found $check" >&2; exit 1; }
check=$($BENCH_PSQL -c "SELECT count(*) FROM billguard.billing_records r JOIN billguard.period_amounts p
                          USING (customer_id, billing_period) WHERE r.amount_cents = p.amount_cents")
[ "$check" = $((2 * n)) ] || { echo "expected $((2 * n)) records of their period amount, found $check" >&2; exit 1; }

min() { printf '%s\n' "$@" | sort -n | head -1; }
awk -v bf="$(min "${base_first[@]}")" -v of="$(min "${ours_first[@]}")" \
    -v ba="$(min "${base_again[@]}")" -v oa="$(min "${ours_again[@]}")" \
    -v bp="$(min "${base_amounts[@]}")" -v op="$(min "${ours_amounts[@]}")" -v n="$n" 'BEGIN {
  printf "bill_period over %d accounts: %.0f ms; seed pre-flight insert: %.0f ms\n", n, of, bf
  printf "  ratio first run: %.2fx (target <= 2.0x; ours also writes %d journal events)\n", of / bf, n
  printf "re-run (idempotent): bill_period %.0f ms; seed insert %.0f ms\n", oa, ba
  printf "  ratio re-run: %.2fx (target <= 1.5x)\n", oa / ba
  printf "bill_period over %d accounts with period amounts: %.0f ms; seed pre-flight insert: %.0f ms\n", n, op, bp
  printf "  ratio with period amounts: %.2fx (target <= 2.0x)\n", op / bp
}'
