// Wake-ups for the callers of billguard.await_billing(): a transaction that
// moves billing records to a terminal status (completed, failed, blocked,
// needs_review, cancelled) wakes, once it has committed, the sessions that
// wait for them. Nobody polls the table.
//
// Shared memory holds kTerminalSlots slots, each a count of announcing
// commits and a condition variable; a record belongs to the slot its
// (customer_id, billing_period) hashes to. The trigger
// billing_records_terminal_wakeup remembers the slots its transaction
// touched; at COMMIT, when the new status is visible, each one is counted
// and broadcast (never for a rollback). A waiter reads its slot's count
// before it reads the record and sleeps only while the count has not moved,
// so a commit between the two is never missed; a commit for another record
// of the same slot only makes it read again.
//
// A record made terminal by a prepared transaction is announced by no one
// (COMMIT PREPARED runs no callback of the preparing session): its waiters
// see it at their timeout.
//
// Without shared_preload_libraries there are no slots: the trigger does
// nothing and there is nothing to wait on.
#pragma once

extern "C" {
#include "postgres.h"
#include "datatype/timestamp.h"
}

#include <optional>
#include <string_view>

namespace billguard {

// Requests the slots' shared memory; called from _PG_init when preloaded.
void InstallTerminalWakeups();

// The count of announcing commits of the record's slot; nullopt when
// billguard is not preloaded.
std::optional<uint64> TerminalCommits(std::string_view customer_id,
                                      std::string_view billing_period);

// Sleeps until the record's slot counts a commit beyond `seen` (true) or
// `deadline` passes (false). Cancellable (pg_cancel_backend,
// statement_timeout): the ERROR leaves through PostgreSQL, so call it in
// CallPostgres. Requires the slots (TerminalCommits gave a value).
bool AwaitTerminalCommit(std::string_view customer_id, std::string_view billing_period, uint64 seen,
                         TimestampTz deadline);

}  // namespace billguard
