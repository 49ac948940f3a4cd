#!/usr/bin/env bash
# PostgreSQL's own regression suite as a peer test: the parallel schedule of
# the installed major's Debian source, run against three fresh servers with
# the same initdb and configuration but for billguard:
#   plain       no billguard
#   preloaded   shared_preload_libraries = 'billguard' (the launcher runs)
#   extension   preloaded, and CREATE EXTENSION billguard in the database
#               the suite runs in (pg_regress --load-extension), so that
#               its event trigger, ProcessUtility hook and dispatcher are live
# Their results are compared with each other, not with the expected files
# (those may be of another minor version): preloaded must match plain byte
# for byte; with the extension only the catalog listings compare.pl names
# may gain rows naming billguard's objects. A test that differs is checked
# against a second plain server: a test whose output two plain servers
# disagree on is nondeterministic, and the other run may match either.
# A crash in any server's log fails the run.
#   test/pg_regress_peer/run.sh WORKDIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:?usage: $0 WORKDIR}
mkdir -p "$work"

# Its exit 3 (no source served) passes through: the caller skips the suite.
suite=$("$here/fetch-suite.sh") || exit $?
bindir=$(pg_config --bindir)
pg_regress=$(dirname "$(pg_config --pgxs)")/../../src/test/regress/pg_regress
echo "suite: src/test/regress of the Debian source $(cat "$suite/SOURCE"), for the server" \
  "$(sed 's/^PostgreSQL //' "$suite/SERVER_VERSION")"

as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
# The server running now, stopped when the run is interrupted.
running=
stop_running() {
  [ -z "$running" ] || as_postgres "$bindir/pg_ctl" -D "$running" -m immediate -w stop >/dev/null 2>&1 || true
}
trap stop_running EXIT

sed -n 's/^test: *//p' "$suite/parallel_schedule" | tr -s ' ' '\n' | sed '/^$/d' >"$work/tests"

# run_server NAME PRELOAD [pg_regress options...]: a fresh cluster, the
# whole schedule, then the cluster stopped. Servers listen on a Unix socket
# in their own directory only, so no port is shared with anything.
run_server() {
  local name=$1 preload=$2
  shift 2
  local dir=$work/$name started=$SECONDS
  rm -rf "$dir" && mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  as_postgres "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-locale --no-sync \
    >"$dir/initdb.log" || { echo "FAIL $name: initdb"; return 1; }
  # What pg_regress's own temporary instance is given, so the results stay
  # close to the expected files.
  {
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$dir'"
    echo "fsync = off"
    echo "log_autovacuum_min_duration = 0"
    echo "log_checkpoints = on"
    echo "log_line_prefix = '%m %b[%p] %q%a '"
    echo "log_lock_waits = on"
    echo "log_temp_files = 128kB"
    echo "max_prepared_transactions = 2"
    if [ "$preload" = yes ]; then echo "shared_preload_libraries = 'billguard'"; fi
  } >>"$dir/data/postgresql.conf"
  running=$dir/data
  as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 120 start >/dev/null ||
    { echo "FAIL $name: the server did not start:"; tail -20 "$dir/server.log"; return 1; }
  local rc=0
  (cd "$dir" && as_postgres "$pg_regress" --host="$dir" --port=5432 --user=postgres \
    --bindir="$bindir" --inputdir="$suite" --outputdir="$dir" --dlpath="$suite/lib" \
    --max-concurrent-tests=20 --schedule="$suite/parallel_schedule" "$@") \
    >"$dir/pg_regress.log" 2>&1 || rc=$?
  # What the comparison may accept as naming billguard's objects.
  if [ "$name" = extension ]; then
    as_postgres "$bindir/psql" -X -q -A -t -F $'\t' -h "$dir" -p 5432 -U postgres -d regression \
      -v ON_ERROR_STOP=1 -f "$here/billguard_objects.sql" >"$dir/billguard-objects.tsv" ||
      { echo "FAIL $name: could not list billguard's objects"; rc=2; }
  fi
  as_postgres "$bindir/pg_ctl" -D "$dir/data" -m fast -w -t 120 stop >/dev/null || rc=2
  running=
  # 1 is "some tests differ from the expected files": information here.
  if [ $rc -gt 1 ]; then
    echo "FAIL $name: the suite did not run to its end (pg_regress exit $rc, or the server did not stop):"
    tail -20 "$dir/pg_regress.log"
    return 1
  fi
  echo "$name: $(tests_run "$dir") tests in $((SECONDS - started)) s;" \
    "differing from the expected files (information only): $(tests_differing "$dir")"
}

# pg_regress's account of a run: "test name ... ok" lines in regression.out
# up to 15; from 16 on, TAP on its output (pg_regress.log here), "ok N -
# name" or "not ok N + name" (and a regression.out only when a test failed).
old_format() { grep -qE ' \.\.\. ' "$1/regression.out" 2>/dev/null; }
tests_run() {
  if old_format "$1"; then grep -cE ' \.\.\. ' "$1/regression.out" || true
  else grep -cE '^(not )?ok [0-9]+ ' "$1/pg_regress.log" || true
  fi
}
tests_differing() {
  if old_format "$1"; then
    grep -oE '^(test| +) [A-Za-z0-9_.]+ +\.\.\. FAILED' "$1/regression.out" | awk '{print $(NF-2)}' | paste -sd' ' || true
  else
    grep -E '^not ok [0-9]+ ' "$1/pg_regress.log" | awk '{print $5}' | paste -sd' ' || true
  fi
}

# A crash (a signal, PANIC, an assertion) in a server's log fails the run,
# even when no result shows it.
crashes() {
  grep -E 'terminated by signal|was terminated by exception|PANIC:|TRAP:|server process .* exited with exit code|all server processes terminated' \
    "$work/$1/server.log" || true
}

failed=0
run_server plain no || failed=1
run_server preloaded yes || failed=1
run_server extension yes --load-extension=billguard || failed=1
[ $failed = 0 ] || exit 1
for name in plain preloaded extension; do
  found=$(crashes "$name")
  [ -z "$found" ] || { echo "FAIL $name: the server log shows a crash:"; echo "$found"; failed=1; }
done

compare() {
  local plains=$1
  "$here/compare.pl" --tests "$work/tests" --mode exact "$plains" "$work/preloaded" \
    >"$work/preloaded.compare" || true
  "$here/compare.pl" --tests "$work/tests" --mode extension --objects "$work/extension/billguard-objects.tsv" \
    "$plains" "$work/extension" >"$work/extension.compare" || true
  ! grep -q '^FAIL' "$work/preloaded.compare" "$work/extension.compare"
}
if ! compare "$work/plain"; then
  echo "a difference: a second plain server tells nondeterministic tests from it"
  run_server plain-again no || exit 1
  found=$(crashes plain-again)
  [ -z "$found" ] || { echo "FAIL plain-again: the server log shows a crash:"; echo "$found"; failed=1; }
  "$here/compare.pl" --tests "$work/tests" --mode exact "$work/plain" "$work/plain-again" |
    sed -n 's/^FAIL \(.*\):$/nondeterministic (two plain servers differ): \1/p'
  compare "$work/plain,$work/plain-again" || true
fi

echo "-- preloaded against plain (must match exactly):"
if [ -s "$work/preloaded.compare" ]; then cat "$work/preloaded.compare"; else echo "   every test the same"; fi
echo "-- with the extension against plain (only listings naming billguard's objects may differ):"
if [ -s "$work/extension.compare" ]; then cat "$work/extension.compare"; else echo "   every test the same"; fi
grep -q '^FAIL' "$work/preloaded.compare" "$work/extension.compare" && failed=1
exit $failed
