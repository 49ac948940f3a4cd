// The dispatcher's worker process (see dispatcher_main.hpp): everything
// around the loop of dispatcher.cpp: signals, connection, whether this
// database is served, the HTTP library, exit.
#include "http_client.hpp"

#include "dispatch_queue.hpp"
#include "dispatcher.hpp"
#include "pg_boundary.hpp"
#include "dispatcher_main.hpp"
#include "shared_state.hpp"
#include "wait_events.hpp"

#include "module.hpp"

extern "C" {
#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"

PGDLLEXPORT void billguard_dispatcher_main(Datum arg);
}

namespace billguard {

namespace {

bool http_initialized = false;

// The database's name, passed by the launcher in bgw_extra, on every line
// the dispatcher logs: one runs per database.
char database_name[NAMEDATALEN];
ErrorContextCallback database_context;

void DatabaseContext(void* /*arg*/) {
  errcontext("billguard dispatcher of database \"%s\"", database_name);
}

void Log(int level, const char* message) {
  CallPostgres([&] { ereport(level, (errmsg("billguard dispatcher: %s", message))); });
}

// Before ProcKill: MyLatch is still the shared latch that was published
// (ProcKill switches it back to the process-local one and frees the PGPROC).
void ReleaseAtExit(int /*code*/, Datum /*arg*/) {
  ReleaseDatabase();
}

void ShutdownHttpAtExit(int /*code*/, Datum /*arg*/) {
  if (http_initialized) ShutdownHttp();
}

// Whether this process serves its database: it has the extension and no
// other dispatcher serves it. A database without the extension is left at
// once, so that no connection stays where billguard has nothing to do.
bool ClaimThisDatabase() {
  const uint64 requests_seen = CallPostgres([] { return ServiceRequests(); });
  if (InstalledExtensionVersion().empty()) {
    CallPostgres([&] { ForgetDatabase(MyDatabaseId, requests_seen); });
    Log(DEBUG1, "no billguard extension in this database");
    return false;
  }
  int other_pid = 0;
  const Claim claim = CallPostgres([&] {
    before_shmem_exit(ReleaseAtExit, 0);
    return ClaimDatabase(&other_pid);
  });
  if (claim == Claim::kServedByAnother) {
    Log(LOG,
        ("the dispatcher with pid " + std::to_string(other_pid) + " serves this database").c_str());
  } else if (claim == Claim::kNoRoom) {
    Log(WARNING,
        "this database is not served: billguard serves at most max_worker_processes databases");
  }
  return claim == Claim::kClaimed;
}

// An HA manager fences a primary it demotes, and a node it promotes until
// it is ready, with default_transaction_read_only = on (pg_auto_failover
// does both); so may an operator. Rather than fail at its first write and
// be started again every few seconds, the dispatcher waits until a reload
// lifts it, and claims nothing meanwhile.
void WaitWhileReadOnly() {
  constexpr const char* kReason =
      "the server is read-only (default_transaction_read_only = on): waiting until it is not";
  if (!DefaultXactReadOnly) return;
  Log(LOG, kReason);
  CallPostgres([&] { PublishDispatcherStatus(true, kReason, 0, 0); });
  while (!ShutdownRequestPending && DefaultXactReadOnly) {
    CallPostgres([] {
      const int rc =
          WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                    billguard::settings::poll_interval_ms, WaitEventOf(WaitFor::kReadOnlyServer));
      if (rc & WL_LATCH_SET) ResetLatch(MyLatch);
      CHECK_FOR_INTERRUPTS();
      if (ConfigReloadPending) {
        ConfigReloadPending = false;
        ProcessConfigFile(PGC_SIGHUP);
      }
    });
  }
  if (!ShutdownRequestPending) Log(LOG, "the server is writable again");
}

}  // namespace

bool StartDispatcher(Oid database, const char* name, BackgroundWorkerHandle** handle) {
  BackgroundWorker worker;
  memset(&worker, 0, sizeof(worker));
  worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
  // The launcher restarts it; the postmaster forgets it after a crash.
  worker.bgw_restart_time = BGW_NEVER_RESTART;
  strlcpy(worker.bgw_library_name, "billguard", BGW_MAXLEN);
  strlcpy(worker.bgw_function_name, "billguard_dispatcher_main", BGW_MAXLEN);
  snprintf(worker.bgw_name, BGW_MAXLEN, "billguard dispatcher for %s", name);
  strlcpy(worker.bgw_type, "billguard dispatcher", BGW_MAXLEN);
  strlcpy(worker.bgw_extra, name, NAMEDATALEN);
  worker.bgw_main_arg = ObjectIdGetDatum(database);
  worker.bgw_notify_pid = MyProcPid;  // the launcher's latch is set when it starts and stops
  return CallPostgres([&] { return RegisterDynamicBackgroundWorker(&worker, handle); });
}

}  // namespace billguard

extern "C" void billguard_dispatcher_main(Datum arg) {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
  BackgroundWorkerUnblockSignals();
  strlcpy(billguard::database_name, MyBgworkerEntry->bgw_extra, NAMEDATALEN);
  billguard::database_context.callback = billguard::DatabaseContext;
  billguard::database_context.previous = error_context_stack;
  error_context_stack = &billguard::database_context;
  BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(arg), InvalidOid, 0);
  pgstat_report_appname("billguard dispatcher");
  // The worker runs as a superuser: its own statements resolve names in
  // pg_catalog only, whatever ALTER ROLE or ALTER DATABASE set.
  SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION);

  // Answers are committed without waiting for the WAL flush: one lost in a
  // crash is re-sent with the same key and replayed by Stripe, and a
  // single-threaded worker must not pay a disk flush per charge. Claims
  // still flush (billguard.claim_due_records).
  SetConfigOption("synchronous_commit", "off", PGC_USERSET, PGC_S_SESSION);
  billguard::GuardedCall("dispatcher", [&]() -> Datum {
    if (!billguard::ClaimThisDatabase()) return 0;
    billguard::WaitWhileReadOnly();
    if (ShutdownRequestPending) return 0;
    billguard::InitializeHttp();
    billguard::http_initialized = true;
    billguard::CallPostgres([] { on_proc_exit(billguard::ShutdownHttpAtExit, 0); });
    billguard::RunDispatcher();
    return 0;
  });
  proc_exit(0);
}
