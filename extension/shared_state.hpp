// billguard's shared memory, allocated when the library is in
// shared_preload_libraries: the launcher, and one entry per database that
// billguard serves, with that database's dispatcher, its wake-up latch and
// what it reports about itself. Without preloading there is none, and every
// function here degrades to a no-op (or reports that nothing runs).
//
// An entry exists for a database once a dispatcher found the extension there
// or CREATE EXTENSION billguard committed in it; only the dispatcher that
// claimed it (pid) writes its status and latch. One LWLock covers everything:
// the table is as small as max_worker_processes and touched briefly. Nothing
// under it raises an error; only LWLockAcquire itself could, in principle,
// so C++ callers with objects alive call these through CallPostgres.
#pragma once

extern "C" {
#include "postgres.h"
#include "datatype/timestamp.h"
#include "storage/latch.h"
}

namespace billguard {

constexpr int kPauseReasonSize = 256;

// What a dispatcher reports about itself (billguard.dispatch_status).
struct DispatcherStatus {
  bool paused = false;
  char pause_reason[kPauseReasonSize] = {0};
  int in_flight = 0;
  int64 requests_sent = 0;
};

// One served database, as dispatcher_state() reports it.
struct ServedDatabase {
  Oid database = InvalidOid;  // InvalidOid: the entry is free
  int pid = 0;                // its dispatcher, 0 while none runs
  Latch* latch = nullptr;     // that dispatcher's wake-up latch
  TimestampTz started_at = 0;
  DispatcherStatus status;
};

// What the launcher reports, with the entry of one database.
struct ServiceReport {
  bool preloaded = false;
  bool launcher_running = false;
  bool out_of_worker_slots = false;  // a database could not get a worker
  bool no_free_entry = false;        // as many served databases as max_worker_processes
  bool has_entry = false;
  ServedDatabase entry;
};

// Requests and initialises the shared memory; called from _PG_init.
void InstallSharedState();

// ---- the dispatcher of MyDatabaseId ----
enum class Claim { kClaimed, kServedByAnother, kNoRoom };
// Registers this process and MyLatch as the database's dispatcher.
Claim ClaimDatabase(int* other_pid);
// Withdraws them (before ProcKill, while MyLatch is the shared latch) and
// wakes the launcher to start the next one.
void ReleaseDatabase();
void PublishDispatcherStatus(bool paused, const char* reason, int in_flight, int64 sent);
// A counter of requests to the launcher (CREATE EXTENSION billguard, ALTER
// DATABASE). A dispatcher that finds no extension forgets the database's
// entry only when no request came in since it read the counter, so that a
// CREATE EXTENSION committing meanwhile is not lost.
uint64 ServiceRequests();
void ForgetDatabase(Oid database, uint64 requests_seen);

// ---- commit-time wake-ups (dispatcher_wakeup.cpp) ----
void WakeDispatcherOf(Oid database);
// The database has the extension now: an entry for it, and the launcher woken.
void RequestService(Oid database);
// A database changed (ALTER DATABASE): the launcher looks at pg_database again.
void RequestRescan();

// ---- the launcher ----
void PublishLauncher();
void WithdrawLauncher();  // before ProcKill, like ReleaseDatabase
// The entries in use: database and dispatcher pid (0 while none runs).
struct EntrySummary {
  Oid database;
  int pid;
};
int ServedDatabases(EntrySummary* out, int capacity);
int EntryCapacity();
// Frees the entry of a database no longer served, once its dispatcher is gone.
void FreeEntry(Oid database);
void SetOutOfWorkerSlots(bool out);

// ---- billguard.dispatcher_state() ----
ServiceReport ReportService(Oid database);

}  // namespace billguard
