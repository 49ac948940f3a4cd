#!/usr/bin/env bash
# `make installcheck`: the pgTAP suites against billguard as installed
# (`make install`), in a running server that preloads it. The server is
# libpq's: PGHOST, PGPORT and PGUSER from the environment; PGDATABASE
# (default postgres) is only where the test database is made from. Like
# pg_regress's installcheck, the suites run in a fresh database,
# $INSTALLCHECK_DB (default billguard_installcheck), dropped first if it
# exists and kept afterwards for a look at what failed.
#   test/installcheck.sh test/pgtap/*.sql
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 PGTAP_FILE..." >&2; exit 2; }
db=${INSTALLCHECK_DB:-billguard_installcheck}
from=${PGDATABASE:-postgres}
sql() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }

# Without the preload the suites would fail one by one on missing settings
# and processes: say once what the server lacks.
preloaded=$(sql -d "$from" -c 'SHOW shared_preload_libraries')
case ",${preloaded// /}," in
  *,billguard,*) ;;
  *) echo "installcheck: the server at ${PGHOST:-the default socket}:${PGPORT:-5432} does not preload billguard" \
       "(shared_preload_libraries = '$preloaded'); add it and restart the server" >&2
     exit 2 ;;
esac
sql -d "$from" -c 'SET client_min_messages = warning' -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
sql -d "$db" -c 'CREATE EXTENSION pgtap' -c 'CREATE EXTENSION billguard'
exec pg_prove -d "$db" "$@"
