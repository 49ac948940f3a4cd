// The dispatcher's worker process (see dispatcher_main.hpp): everything
// around the loop of dispatcher.cpp: signals, connection, whether this
// database is served, the HTTP library, exit.
#include "common/http_client.hpp"

#include "workers/dispatch_queue.hpp"
#include "workers/dispatcher.hpp"
#include "postgres/pg_boundary.hpp"
#include "postgres/database_worker.hpp"
#include "workers/dispatcher_main.hpp"
#include "settings/dispatcher_settings.hpp"
#include "postgres/shared_state.hpp"
#include "postgres/wait_events.hpp"
#include "workers/worker_signals.hpp"

#include "settings/settings.hpp"

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
  // Started just before a statement that needs the database without
  // connections held it (that statement stops no dispatcher it cannot
  // see): leave, and have the launcher serve the database once it is over.
  if (CallPostgres([] { return IsHeld(MyDatabaseId); })) {
    CallPostgres([] { RequestService(MyDatabaseId); });
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
// does both); so may an operator, for the server or with ALTER DATABASE
// for one database. Rather than fail at its first write and be started
// again every few seconds, the dispatcher waits until the fence is lifted,
// and claims nothing meanwhile. The database's setting is read from the
// catalog at every poll, so lifting it shows without a new connection.
void WaitWhileReadOnly() {
  std::string reason = ReadOnlyFence();
  if (reason.empty()) return;
  Log(LOG, reason.c_str());
  const bool server = reason.rfind("the server", 0) == 0;
  DispatcherStatus status;
  status.paused = true;
  strlcpy(status.pause_reason, reason.c_str(), sizeof(status.pause_reason));
  CallPostgres([&] { PublishDispatcherStatus(status); });
  while (!ShutdownRequestPending && !reason.empty()) {
    CallPostgres([] {
      const int rc =
          WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                    billguard::settings::poll_interval_ms, WaitEventOf(WaitFor::kReadOnlyServer));
      if (rc & WL_LATCH_SET) ResetLatch(MyLatch);
      CHECK_FOR_INTERRUPTS();
    });
    if (ConfigReloadPending) {
      ConfigReloadPending = false;
      CallPostgres([] { ProcessConfigFile(PGC_SIGHUP); });
      RetakeDispatcherSettings();
    }
    reason = ReadOnlyFence();
  }
  if (!ShutdownRequestPending)
    Log(LOG, server ? "the server is writable again" : "this database is writable again");
}

}  // namespace

bool StartDispatcher(Oid database, const char* name, BackgroundWorkerHandle** handle) {
  // The launcher restarts it; the postmaster forgets it after a crash.
  BackgroundWorker worker =
      DatabaseWorker("billguard_dispatcher_main", "billguard dispatcher for", name, database);
  strlcpy(worker.bgw_type, "billguard dispatcher", BGW_MAXLEN);
  strlcpy(worker.bgw_extra, name, NAMEDATALEN);
  return CallPostgres([&] { return RegisterDynamicBackgroundWorker(&worker, handle); });
}

}  // namespace billguard

extern "C" void billguard_dispatcher_main(Datum arg) {
  billguard::InstallWorkerSignals(billguard::OnSigterm::kShutdownCancellingWaits);
  strlcpy(billguard::database_name, MyBgworkerEntry->bgw_extra, NAMEDATALEN);
  billguard::database_context.callback = billguard::DatabaseContext;
  billguard::database_context.previous = error_context_stack;
  error_context_stack = &billguard::database_context;
  BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(arg), InvalidOid, 0);
  pgstat_report_appname("billguard dispatcher");
  billguard::GuardedCall("dispatcher", [&]() -> Datum {
    try {
      billguard::TakeDispatcherSettings();
      if (!billguard::ClaimThisDatabase()) return 0;
      billguard::WaitWhileReadOnly();
      if (ShutdownRequestPending) return 0;
      billguard::InitializeHttp();
      billguard::http_initialized = true;
      billguard::CallPostgres([] { on_proc_exit(billguard::ShutdownHttpAtExit, 0); });
      billguard::RunDispatcher();
    } catch (const std::exception& failure) {
      // SIGTERM cancelled a statement or a wait (see worker_signals.hpp):
      // a shutdown, not a failure.
      if (ShutdownRequestPending && dynamic_cast<const billguard::PostgresError*>(&failure)) {
        QueryCancelPending = false;
        return 0;
      }
      // Kept for dispatch_status while the launcher starts the next one.
      billguard::CallPostgres([&] { billguard::PublishDispatcherFailure(failure.what()); });
      throw;
    }
    return 0;
  });
  proc_exit(0);
}
