#!/usr/bin/env bash
# A first look at pg_upgrade to this chroot's major from the one before,
# which test/install-deps.sh installs beside it (trixie: 15 from bookworm;
# forky: 17 from trixie): billguard built for both, a cluster of the old
# major with 50 records claimed and in flight (pending: no API key, so
# nothing is sent), pg_upgrade in copy or link mode, and the records, keys
# and journal compared after it. A quick look: the suite's scenario, with
# history, records in flight and the emulator, is
# test/t/197_pg_upgrade_across_majors.pl.
#   test/majors/chroot.sh run 17 /src/test/majors/inside.sh test/majors/upgrade-probe.sh [copy|link]
set -euo pipefail
mode=${1:-copy}
[ -n "${BILLGUARD_IN_CHROOT:-}" ] || { echo "upgrade-probe.sh: runs in a chroot (see its header)" >&2; exit 2; }
new=$(pg_config --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')
old=$(ls /usr/lib/postgresql | sort -n | awk -v n="$new" '$1 < n' | tail -1)
[ -n "$old" ] || { echo "upgrade-probe.sh: no major before $new is installed" >&2; exit 2; }
oldbin=/usr/lib/postgresql/$old/bin newbin=/usr/lib/postgresql/$new/bin
root=$PWD

# billguard for both majors, the old one from a copy of this tree.
make -s && make -s install
rm -rf "/build/billguard-$old" && cp -a "$root" "/build/billguard-$old"
(cd "/build/billguard-$old" && make -s clean && make -s PG_CONFIG=$oldbin/pg_config && make -s PG_CONFIG=$oldbin/pg_config install) >/dev/null

w=$(mktemp -d "/tmp/billguard-upgrade-$old-$new.XXXXXX")
chmod 755 "$w" && chown postgres: "$w"
as_postgres() { runuser -u postgres -- "$@"; }
port=$((20000 + RANDOM % 20000))
cleanup() {
  for d in old new; do [ -f "$w/$d/postmaster.pid" ] && as_postgres "/usr/lib/postgresql/$([ $d = old ] && echo "$old" || echo "$new")/bin/pg_ctl" -D "$w/$d" -m immediate stop >/dev/null 2>&1; done
  cd / && rm -rf "$w"
}
trap cleanup EXIT
cd "$w"
cluster() {
  local bin=$1 dir=$2; shift 2
  as_postgres "$bin/initdb" -D "$w/$dir" -U postgres -A trust -E UTF8 --no-locale "$@" >/dev/null
  printf "port = %s\nlisten_addresses = ''\nunix_socket_directories = '%s'\nshared_preload_libraries = 'billguard'\nfsync = off\n" \
    "$port" "$w" >>"$w/$dir/postgresql.conf"
}
psql() { command psql -X -qAt -h "$w" -p "$port" -U postgres -d postgres "$@"; }
records() {
  psql -c "SELECT customer_id, billing_period, idempotency_key, status, amount_cents FROM billguard.billing_records ORDER BY 1, 2" \
    -c "SELECT persistence_id, seq_nr, event_type, event FROM billguard.journal ORDER BY 1, 2"
}

cluster $oldbin old
as_postgres $oldbin/pg_ctl -D "$w/old" -l "$w/old.log" -w start >/dev/null
psql -c "CREATE EXTENSION billguard" -c "
  INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
  SELECT 'cust_' || lpad(g::text, 6, '0'), 'cus_' || g, 1000 + g, 'usd', 'pm_card_visa'
    FROM generate_series(1, 50) g" -c "SELECT billguard.bill_period('2026-08')" >/dev/null
records >"$w/before"
echo "PostgreSQL $old: $(psql -c "SELECT string_agg(status || ' ' || n, ', ') FROM (SELECT status, count(*) n FROM billguard.billing_records GROUP BY 1) s"), $(psql -c 'SELECT count(*) FROM billguard.journal') journal events"
as_postgres $oldbin/pg_ctl -D "$w/old" -w stop >/dev/null

# pg_upgrade needs both clusters with data checksums or both without, and
# 18's initdb turns them on unless told not to.
checksums=()
if [ "$new" -ge 18 ] && as_postgres $oldbin/pg_controldata "$w/old" | grep -q '^Data page checksum version: *0$'; then
  checksums=(--no-data-checksums)
fi
cluster $newbin new "${checksums[@]}"
flags=(); [ "$mode" = link ] && flags=(--link)
t0=$SECONDS
as_postgres $newbin/pg_upgrade -b $oldbin -B $newbin -d "$w/old" -D "$w/new" -p "$port" -P "$port" "${flags[@]}" >"$w/pg_upgrade.out" 2>&1 \
  || { tail -30 "$w/pg_upgrade.out"; grep -h -B2 -A8 "ERROR" "$w"/new/pg_upgrade_output.d/*/log/*.log | head -60; exit 1; }
echo "pg_upgrade $old -> $new ($mode): $((SECONDS - t0)) s"
as_postgres $newbin/pg_ctl -D "$w/new" -l "$w/new.log" -w start >/dev/null
records >"$w/after"
echo "PostgreSQL $new: billguard $(psql -c "SELECT extversion FROM pg_extension WHERE extname = 'billguard'")"
if cmp -s "$w/before" "$w/after"; then
  echo "every record, key and journal event is the same after pg_upgrade"
else
  diff "$w/before" "$w/after" | head -20
  exit 1
fi
