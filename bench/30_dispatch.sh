#!/usr/bin/env bash
# The dispatcher against the Stripe emulator, on a cluster of its own:
#  - throughput at 50 ms latency for max_inflight 64 and 200 (rate limit
#    high), 3,000 charges, as a fraction of the ideal max_inflight / latency;
#  - max_requests_per_second = 100 against an emulator limiting at 100/s:
#    achieved rate as a fraction of 100, and the 429s it caused;
#  - CPU of all of PostgreSQL (the worker included) and WAL per charge at
#    zero latency, against the targets, and the WAL by record type
#    (pg_waldump --stats=record over the same window);
#  - the worker's RSS while a 100,000-record backlog drains;
#  - wake-up: from the COMMIT of bill_customer to the claim of its record.
set -euo pipefail
source bench/lib.sh dispatch

start_emulator
control() { curl -s -X POST "$emulator/_emulator/$1" -d "$2" >/dev/null; }
stat_of() { curl -s "$emulator/_emulator/stats" | sed "s/.*\"$1\":\([0-9]*\).*/\1/"; }

write_secret "$dir/stripe.key" sk_test_billguard_bench_key
[ "$(id -u)" = 0 ] && chown postgres "$dir/stripe.key"
start_cluster \
  "billguard.database = 'postgres'" "billguard.api_base = '$emulator'" \
  "billguard.api_key_file = '$dir/stripe.key'" "billguard.poll_interval = '1s'" \
  "shared_buffers = 512MB" "max_wal_size = 4GB"
setting() { sql -c "ALTER SYSTEM SET billguard.$1 = $2" -c "SELECT pg_reload_conf()" >/dev/null; }
sql -c "CREATE EXTENSION billguard"
sql -c "INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, payment_method)
        SELECT 'cust_' || lpad(g::text, 6, '0'), 'cus_' || g, 1000, 'pm_card_visa'
          FROM generate_series(1, 100000) g"
worker_pid() { sql -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'billguard dispatcher'"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
cluster_ticks() {  # every process of this cluster: the postmaster and its children
  local pm total=0
  pm=$(head -1 "$dir/pg/data/postmaster.pid")
  for p in $pm $(pgrep -P "$pm"); do total=$((total + $(cpu_ticks "$p" 2>/dev/null || echo 0))); done
  echo $total
}

# Bills the first $1 accounts for period $2 and waits until all settled;
# prints charges per second measured in the database (first claim to last
# completion).
run_period() {
  local n=$1 period=$2
  sql -c "UPDATE billguard.accounts SET active = customer_id <= 'cust_' || lpad('$n', 6, '0')" >/dev/null
  sql -c "SELECT initiated FROM billguard.bill_period('$period')" >/dev/null
  settle_rate "$period"
}

echo "throughput at 50 ms latency, 3,000 charges, max_requests_per_second = 100000:"
control config '{"latency_ms": 50, "rate_limit": 0}'
setting max_requests_per_second 100000
month=1
for inflight in 64 200; do
  setting max_inflight "$inflight"
  sleep 0.3
  rate=$(run_period 3000 "2030-$(printf %02d $month)")
  month=$((month + 1))
  awk -v i="$inflight" -v r="$rate" 'BEGIN {
    ideal = i / 0.050
    printf "  max_inflight %3d: %7.1f charges/s of ideal %6.0f: %.3f (target >= 0.9)\n", i, r, ideal, r / ideal }'
done
# What this machine allows right now: the emulator alone, 200 clients.
alone=$(perl test/emulator/measure-throughput.pl --clients 200 --latency-ms 50 --seconds 3 |
  sed -n 's/.*, \([0-9]*\) req\/s,.*/\1/p')
awk -v a="$alone" 'BEGIN {
  printf "  (baseline, same run: the emulator alone serves 200 keep-alive clients %d requests/s: %.3f of ideal)\n", a, a / 4000 }'

echo "pacing at max_requests_per_second = 100 against an emulator limiting at 100/s:"
control reset '{}'
control config '{"latency_ms": 50, "rate_limit": 100}'
setting max_inflight 32
setting max_requests_per_second 100
sleep 0.3
rate=$(run_period 1000 2031-01)
awk -v r="$rate" -v l="$(stat_of rate_limited)" 'BEGIN {
  printf "  achieved %.1f requests/s: %.3f of 100 (target >= 0.95), 429s from the limiter: %d (target 0)\n", r, r / 100, l }'

echo "database cost per charge (zero latency, 5,000 charges; the period is billed while the dispatcher is paused, so only dispatching is measured):"
control config '{"latency_ms": 0, "rate_limit": 0}'
setting max_requests_per_second 100000
setting max_inflight 32
sql -c "CHECKPOINT" >/dev/null
setting api_key_file "''"
sleep 0.3
sql -c "UPDATE billguard.accounts SET active = customer_id <= 'cust_005000'" >/dev/null
sql -c "SELECT initiated FROM billguard.bill_period('2031-02')" >/dev/null
wpid=$(worker_pid)
hz=$(getconf CLK_TCK)
w0=$(cpu_ticks "$wpid"); c0=$(cluster_ticks); l0=$(sql -c "SELECT pg_current_wal_lsn()")
setting api_key_file "'$dir/stripe.key'"
wait_completed 2031-02
w1=$(cpu_ticks "$wpid"); c1=$(cluster_ticks); l1=$(sql -c "SELECT pg_current_wal_lsn()")
wal=$(sql -c "SELECT pg_wal_lsn_diff('$l1', '$l0')")
rate=$(charges_per_second 2031-02)
# WAL: the design's floor is ~1.8 KB a charge (frozen request bodies, two
# journal events and the Request-Id are kept on purpose); 2,300 B allows
# headroom above it.
awk -v w=$((w1 - w0)) -v c=$((c1 - c0)) -v hz="$hz" -v wal="$wal" -v r="$rate" 'BEGIN {
  printf "  database CPU (every process of the cluster, the worker included) %.0f us per charge: %.2f of the 150 us target (target <= 1)\n",
         c / hz * 1e6 / 5000, c / hz * 1e6 / 5000 / 150
  printf "  WAL %.0f bytes per charge: %.2f of the 2,300 B target (target <= 1)\n", wal / 5000, wal / 5000 / 2300
  printf "  (the worker alone %.0f us per charge, HTTP included; %.0f charges/s)\n", w / hz * 1e6 / 5000, r }'
# Where that WAL goes: pg_waldump's statistics over the same window.
pg_waldump -p "$dir/pg/data/pg_wal" -s "$l0" -e "$l1" --stats=record 2>/dev/null |
  awk '/^[A-Za-z0-9]+\/[A-Z0-9_+]+ / { gsub(/\( *[0-9.]+\)/, ""); bytes[$1] += $5; fpi += $4 }
       END { for (t in bytes) if (bytes[t] >= 10 * 5000) printf "%d %s\n", bytes[t], t
             printf "%d full-page-images\n", fpi }' |
  sort -rn | awk '{ line = line sprintf("%s%s %.0f", NR > 1 ? ", " : "", $2, $1 / 5000) }
                  END { if (NR) print "  (WAL by record type, bytes per charge: " line ")" }' || true

echo "worker memory while a 100,000-record backlog drains (zero latency):"
sql -c "UPDATE billguard.accounts SET active = true" >/dev/null
sql -c "SELECT initiated FROM billguard.bill_period('2031-03')" >/dev/null
samples=()
vmrss=0
for _ in $(seq 12); do
  samples+=("$(awk '/RssAnon/ {print $2}' "/proc/$wpid/status")")
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$wpid/status")
  [ "$rss" -gt "$vmrss" ] && vmrss=$rss
  sleep 1
done
left=$(sql -c "SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2031-03' AND status <> 'completed'")
printf '  private memory (RssAnon) kB each second: %s\n' "${samples[*]}"
awk -v first="${samples[0]}" -v last="${samples[-1]}" -v left="$left" -v all="${samples[*]}" -v vm="$vmrss" 'BEGIN {
  n = split(all, s, " "); max = 0; for (i = 1; i <= n; i++) if (s[i] > max) max = s[i]
  printf "  private max %.1f MB (target < 64 MB), drift %+.1f MB over %d s, %d of 100,000 still open\n",
         max / 1024, (last - first) / 1024, n, left
  printf "  (VmRSS max %.1f MB: it also counts the shared_buffers pages the worker has touched)\n", vm / 1024 }'
until [ "$(sql -c "SELECT count(*) FROM billguard.billing_records WHERE status <> 'completed'")" = 0 ]; do sleep 0.5; done

echo "wake-up latency, idle worker (poll interval 1 s): COMMIT of bill_customer to the claim"
for i in $(seq 20); do
  sql -c "SELECT 1 FROM billguard.bill_customer('cust_$(printf %06d "$i")', '2031-04')" >/dev/null
  sql -c "SELECT 1" >/dev/null
  sleep 0.2
done
sql -c "SELECT format('  median %s ms, max %s ms over %s charges (target < 100 ms)',
                     round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
                     round(max(ms)::numeric, 1), count(*))
          FROM (SELECT extract(epoch FROM r.first_dispatched_at - j.written_at) * 1000 AS ms
                  FROM billguard.billing_records r
                  JOIN billguard.journal j ON j.persistence_id = 'billing-' || r.customer_id || '-' || r.billing_period
                                          AND j.seq_nr = 1
                 WHERE r.billing_period = '2031-04') s"
