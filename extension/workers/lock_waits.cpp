// What a dispatcher statement waited for (see lock_waits.hpp).
#include "workers/lock_waits.hpp"

#include "postgres/spi_transaction.hpp"

extern "C" {
#include "utils/errcodes.h"
}

namespace billguard {

bool IsLockTimeout(const PostgresError& error) {
  return error.data() != nullptr && error.data()->sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE;
}

std::string DescribeLockHolders() {
  // A lock in one of these modes keeps a plain read (ACCESS EXCLUSIVE) or a
  // write (the others) of the table waiting.
  const std::vector<SqlRow> rows = ExecuteInTransaction(R"(
SELECT string_agg(format('%s is locked (%s) by pid %s (role %s, application %s, for %s s)',
                         l.relation::regclass, l.mode, l.pid, coalesce(a.usename, '?'),
                         coalesce(nullif(a.application_name, ''), '?'),
                         coalesce(floor(extract(epoch FROM now() - a.xact_start))::text, '?')),
                  '; ' ORDER BY l.relation::regclass::text, l.pid)
  FROM pg_catalog.pg_locks l
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_catalog.pg_backend_pid()
   AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
   AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
   AND l.relation IN (SELECT c.oid FROM pg_catalog.pg_class c
                        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                       WHERE n.nspname = 'billguard'))",
                                                        {});
  if (!rows.empty() && rows[0][0]) return *rows[0][0];
  return "a row or an object another session held locked (none holds one of billguard's tables "
         "now)";
}

}  // namespace billguard
