// The settings a dispatcher runs with, whatever the database's owner set.
//
// A background worker takes the settings of ALTER DATABASE ... SET and
// ALTER ROLE ... SET when it connects, as a session does. Those belong to
// the database's users: `role = 'dbowner'` would run the dispatcher as the
// owner (permission denied on billguard's schema at every start),
// `enable_indexscan = off` would make every claim scan billing_records,
// `statement_timeout` or `default_transaction_isolation` would fail its
// statements. The dispatcher runs with the server's values of those
// instead (postgresql.conf, ALTER SYSTEM, or PostgreSQL's defaults) and
// logs each setting it did not take. A database-level read-only setting is
// a fence, not a setting to take: the dispatcher reads it from the catalog,
// where lifting it shows without a new connection.
#pragma once

#include <string>

namespace billguard {

// How long a dispatcher statement waits for a lock before it gives up and
// is tried again later: users may lock what it reads (the accounts), and a
// wait without bound would stop all billing of the database.
constexpr int kLockTimeoutMs = 1000;

// Right after connecting, before any statement: the settings set for this
// database or the dispatcher's role that it depends on take the server's
// values, with a LOG line each when `log`; the settings it needs take its
// own values. Also for billguard's other workers in a database.
void TakeDispatcherSettings(bool log = true);

// After a reload: the overridden settings take the server's new values.
void RetakeDispatcherSettings();

// Why the dispatcher may not write now ("" when it may): the server's
// default_transaction_read_only, or the one ALTER DATABASE / ALTER ROLE
// ... SET for this database or the dispatcher's role, as the catalog holds
// it now. Runs a statement in a transaction of its own.
std::string ReadOnlyFence();

}  // namespace billguard
