// A dispatcher statement that waited kLockTimeoutMs for a lock gave up
// (SQLSTATE 55P03): what it waited for, for dispatch_status and the log,
// so that a session holding billguard.accounts locked, say, is named
// rather than the dispatcher seeming to run while it bills nothing.
#pragma once

#include <string>

#include "postgres/pg_boundary.hpp"

namespace billguard {

// Whether `error` is a lock wait that lock_timeout ended.
bool IsLockTimeout(const PostgresError& error);

// "billguard.accounts is locked (AccessExclusiveLock) by pid 4242 (role
// billing_accounts, application psql, for 12 s)", for every lock other
// sessions hold on billguard's tables in a mode that keeps a read or a
// write of them waiting; or, when none does, that a row or another object
// was locked. Runs a statement in a transaction of its own.
std::string DescribeLockHolders();

}  // namespace billguard
