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

constexpr int kPauseReasonSize = 512;
// billguard.key_namespace as the dispatcher compares it with the others';
// a longer one is compared by this much of it.
constexpr int kNamespaceSize = 128;

// What a dispatcher reports about itself (billguard.dispatch_status).
struct DispatcherStatus {
  bool paused = false;
  char pause_reason[kPauseReasonSize] = {0};
  int in_flight = 0;
  int64 requests_sent = 0;
  // A lock one of its statements gave up waiting for, tried again later.
  char waiting_for[kPauseReasonSize] = {0};
  // Why its scheduler bills nothing now, though auto_bill may be on.
  char scheduler_pause_reason[kPauseReasonSize] = {0};
};

// One served database, as dispatcher_state() reports it.
struct ServedDatabase {
  Oid database = InvalidOid;  // InvalidOid: the entry is free
  int pid = 0;                // its dispatcher, 0 while none runs
  Latch* latch = nullptr;     // that dispatcher's wake-up latch
  TimestampTz started_at = 0;
  DispatcherStatus status;
  // The error that ended its last dispatcher, and how many in a row ended
  // so since one reached its loop: what dispatch_status says while none runs.
  char last_failure[kPauseReasonSize] = {0};
  TimestampTz last_failure_at = 0;
  int failures = 0;
  // The namespace it bills with, while it is the billing database; kept
  // while its dispatcher restarts, so that no other takes it meanwhile.
  bool bills = false;
  char key_namespace[kNamespaceSize] = {0};
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
void PublishDispatcherStatus(const DispatcherStatus& status);
// The error that is ending this dispatcher (kept for dispatch_status), and
// the start that reached the loop, which clears it.
void PublishDispatcherFailure(const char* message);
void ClearDispatcherFailure();
// Whether this database bills with `key_namespace` (false: it bills
// nothing); the served database of lowest OID that bills with the same
// namespace, if another one does: of two, the one created later yields.
Oid ClaimKeyNamespace(bool bills, const char* key_namespace);
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

// ---- statements that need a database without connections ----
// DROP DATABASE, ALTER DATABASE ... RENAME or SET TABLESPACE and CREATE
// DATABASE ... TEMPLATE fail while another session is connected to the
// database. The backend running one holds the database: the launcher
// starts no dispatcher nor probe there, and the running dispatcher, if any,
// is stopped; once the statement is over (or the backend gone) the hold
// ends and the launcher serves the database again.
constexpr int kMaxHolds = 16;
// False when kMaxHolds databases are held already.
bool HoldDatabase(Oid database);
// Ends every hold of this backend.
void ReleaseHolds();
// Whether a live backend holds the database (the launcher asks).
bool IsHeld(Oid database);
// The pid of the database's dispatcher, 0 when none runs.
int DispatcherPidOf(Oid database);

// What a probe of a held database found (the DROP DATABASE guard): a
// background worker connects to it, as no backend can read another database.
struct HistoryProbe {
  bool done = false;
  bool has_extension = false;
  int64 billing_records = 0;
  // Not a copy or a restore waiting to be adopted (billing_database_problem()).
  bool billing_database = true;
  char error[kPauseReasonSize] = {0};
};
// The probe's answer, for the backend that holds `database`.
void PublishHistoryProbe(Oid database, int holder_pid, const HistoryProbe& probe);
// The answer of the probe this backend started for `database`.
HistoryProbe TakeHistoryProbe(Oid database);

}  // namespace billguard
