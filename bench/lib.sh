# Sourced by the benchmarks that start servers of their own (30, 40, 50), so
# each starts and stops them the same way: a work directory removed at
# exit, a throwaway cluster, the Stripe emulator and billguard-proxy, each
# process stopped by pid when the benchmark ends.
#   source bench/lib.sh NAME       $dir (a work directory) and $port (the cluster's)
#   start_cluster [conf lines]     test/cluster.sh in $dir/pg, billguard preloaded
#   sql ARGS / sql_in DB ARGS      psql -At on its database postgres / DB
#   start_emulator [flags]         sets $emulator, http://127.0.0.1:PORT
#   start_proxy DB [flags]         the proxy, its ledger in DB; sets $proxy
#   write_secret FILE CONTENT      a file only its owner may read
#   wait_completed PERIOD          until every record of PERIOD is completed
#   charges_per_second PERIOD      of PERIOD, first claim to last completion
#   settle_rate PERIOD             both

dir=$(mktemp -d "/tmp/billguard-bench-$1.XXXXXX")
chmod 755 "$dir"
port=$((20000 + RANDOM % 20000))
bench_pids=()
bench_cleanup() {
  local pid
  for pid in "${bench_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -d "$dir/pg/data" ] && { test/cluster.sh stop "$dir/pg" immediate 2>/dev/null || true; }
  rm -rf "$dir"
}
trap bench_cleanup EXIT

start_cluster() {
  mkdir -p "$dir/pg"
  test/cluster.sh start "$dir/pg" "$port" "$@"
}
sql_in() { local db=$1; shift; psql -X -q -At -h "$dir/pg" -p "$port" -U postgres -d "$db" "$@"; }
sql() { sql_in postgres "$@"; }

# The address a server announces as "listening on ADDRESS" in file $1.
announced() {
  for _ in $(seq 100); do grep -qs '^listening on ' "$1" && break; sleep 0.1; done
  sed -n 's/^listening on //p' "$1"
}

start_emulator() {
  tools/stripe-emulator/billguard-stripe-emulator --listen 127.0.0.1:0 --quiet "$@" \
    >"$dir/emulator.out" 2>/dev/null &
  bench_pids+=($!)
  emulator=http://$(announced "$dir/emulator.out")
}

start_proxy() {
  local db=$1; shift
  worker/billguard-proxy --listen 127.0.0.1:0 --database "host=$dir/pg port=$port user=postgres dbname=$db" \
    "$@" >"$dir/proxy.out" 2>"$dir/proxy.log" &
  bench_pids+=($!)
  proxy=http://$(announced "$dir/proxy.out")
}

write_secret() { (umask 077 && printf '%s\n' "$2" >"$1"); }

wait_completed() {
  until [ "$(sql -c "SELECT count(*) FROM billguard.billing_records WHERE billing_period = '$1' AND status <> 'completed'")" = 0 ]; do
    sleep 0.05
  done
}
charges_per_second() {
  sql -c "SELECT round(count(*) / extract(epoch FROM max(completed_at) - min(first_dispatched_at))::numeric, 1)
            FROM billguard.billing_records WHERE billing_period = '$1'"
}
settle_rate() { wait_completed "$1" && charges_per_second "$1"; }
