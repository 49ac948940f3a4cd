// The dispatcher's worker process (dispatcher_main.cpp): one per served
// database, started by the launcher; its loop is dispatcher.cpp.
#pragma once

extern "C" {
#include "postgres.h"
#include "postmaster/bgworker.h"
}

namespace billguard {

// Registers a dispatcher for `database` (named for logs and ps); false when
// no background worker slot is free.
bool StartDispatcher(Oid database, const char* name, BackgroundWorkerHandle** handle);

}  // namespace billguard
