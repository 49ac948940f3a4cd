// The dispatcher's registration and entry point: the process around the
// loop of dispatcher.cpp (signals, connection, HTTP library, exit).
#include "http_client.hpp"

#include "dispatcher.hpp"
#include "dispatcher_wakeup.hpp"
#include "module.hpp"
#include "pg_boundary.hpp"
#include "shared_state.hpp"

extern "C" {
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "utils/guc.h"

PGDLLEXPORT void billguard_dispatcher_main(Datum arg);
}

namespace billguard {

namespace {

void MarkRunning(int pid) {
  SharedState* shared = Shared();
  if (shared == nullptr) return;
  SpinLockAcquire(&shared->mutex);
  shared->dispatcher_pid = pid;
  shared->dispatcher_started_at = pid != 0 ? GetCurrentTimestamp() : 0;
  shared->in_flight = 0;
  SpinLockRelease(&shared->mutex);
}

bool http_initialized = false;

// Before ProcKill: MyLatch is still the shared latch that was published
// (ProcKill switches it back to the process-local one and frees the PGPROC).
void WithdrawAtExit(int /*code*/, Datum /*arg*/) {
  WithdrawDispatcherLatch();
  MarkRunning(0);
}

void ShutdownHttpAtExit(int /*code*/, Datum /*arg*/) {
  if (http_initialized) ShutdownHttp();
}

}  // namespace

void RegisterDispatcher() {
  BackgroundWorker worker;
  memset(&worker, 0, sizeof(worker));
  worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
  worker.bgw_restart_time = 2;  // seconds: supervised, restarted after a crash
  strlcpy(worker.bgw_library_name, "billguard", BGW_MAXLEN);
  strlcpy(worker.bgw_function_name, "billguard_dispatcher_main", BGW_MAXLEN);
  strlcpy(worker.bgw_name, "billguard dispatcher", BGW_MAXLEN);
  strlcpy(worker.bgw_type, "billguard dispatcher", BGW_MAXLEN);
  RegisterBackgroundWorker(&worker);
}

}  // namespace billguard

extern "C" void billguard_dispatcher_main(Datum /*arg*/) {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
  BackgroundWorkerUnblockSignals();
  BackgroundWorkerInitializeConnection(billguard::settings::database, nullptr, 0);
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
    billguard::InitializeHttp();
    billguard::http_initialized = true;
    billguard::CallPostgres([] {
      on_proc_exit(billguard::ShutdownHttpAtExit, 0);
      before_shmem_exit(billguard::WithdrawAtExit, 0);
      billguard::PublishDispatcherLatch();
      billguard::MarkRunning(MyProcPid);
    });
    billguard::RunDispatcher();
    return 0;
  });
  // Exit code 1 even after SIGTERM: the postmaster then restarts a dispatcher
  // that was stopped alone, and does not during server shutdown.
  proc_exit(1);
}
