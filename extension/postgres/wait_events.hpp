// What billguard's processes wait for, as pg_stat_activity.wait_event names
// it: on PostgreSQL 17 and later each wait has its own name (type
// "Extension"); before 17 each shows as "Extension".
#pragma once

extern "C" {
#include "postgres.h"
}

namespace billguard {

enum class WaitFor {
  kLauncherIdle,    // the launcher, until a rescan or a dispatcher start is due
  kDispatcherIdle,  // a dispatcher, until work is due, an answer arrives or a commit wakes it
  kReadOnlyServer,  // a dispatcher on a read-only server, until it is writable
  kTerminalCommit,  // await_billing(), until the record's terminal status commits
  kDispatcherExit,  // DROP, RENAME or a template copy of a database, until its dispatcher left
  kProbeSlot,       // DROP DATABASE, until a worker slot is free for its history probe
};

// The wait event to pass to WaitLatch or ConditionVariableTimedSleep. May
// raise an ERROR (the first call in a process registers the name): call it
// where PostgreSQL may raise, as the waits themselves do.
uint32 WaitEventOf(WaitFor wait);

}  // namespace billguard
