#!/usr/bin/env bash
# A throwaway PostgreSQL cluster (of pg_config) run as the postgres user, with billguard
# preloaded. Used by the test runner, the demo and the benchmarks.
#   test/cluster.sh start DIR PORT [postgresql.conf lines...]
#   test/cluster.sh stop DIR [fast|immediate]
#   test/cluster.sh restart DIR
set -euo pipefail
PG_BIN=${PG_BIN:-$(pg_config --bindir)}
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

cmd=$1 dir=$2
case $cmd in
  start)
    port=$3; shift 3
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    as_postgres "$PG_BIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-locale >"$dir/initdb.log"
    {
      echo "port = $port"
      echo "listen_addresses = '127.0.0.1'"
      echo "unix_socket_directories = '$dir'"
      echo "shared_preload_libraries = 'billguard'"
      echo "fsync = off"
      echo "max_connections = 100"
      echo "log_line_prefix = '%m [%p] %q%a '"
      for line in "$@"; do echo "$line"; done
    } >>"$dir/data/postgresql.conf"
    as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
    ;;
  stop)
    as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -m "${3:-fast}" -w -t 60 stop >/dev/null
    ;;
  restart)
    as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 restart >/dev/null
    ;;
  *) echo "usage: $0 start DIR PORT [conf...] | stop DIR [mode] | restart DIR" >&2; exit 2 ;;
esac
