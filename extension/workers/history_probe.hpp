// Whether a database holds billing history that DROP DATABASE would lose
// (database_statements.cpp). A backend cannot read another database, so a
// short-lived background worker connects to it, also to one that does not
// allow connections, counts billguard.billing_records and asks whether the
// database bills that history (a copy or a restore waiting to be adopted
// does not), and answers through shared memory.
#pragma once

extern "C" {
#include "postgres.h"
}

namespace billguard {

// Plain PostgreSQL code (it may ereport): runs the probe of `database`,
// which this backend holds, and waits for it. Raises an error when no
// probe could run or it ended without an answer.
void ProbeHistory(Oid database, const char* name, bool* has_history, int64* billing_records);

}  // namespace billguard
