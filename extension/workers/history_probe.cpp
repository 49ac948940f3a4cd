// The probe of a database's billing history (see history_probe.hpp).
#include <string>

#include "postgres/pg_boundary.hpp"

#include "postgres/database_worker.hpp"
#include "settings/dispatcher_settings.hpp"
#include "workers/history_probe.hpp"
#include "postgres/shared_state.hpp"
#include "postgres/spi_transaction.hpp"
#include "postgres/wait_events.hpp"
#include "workers/worker_signals.hpp"

extern "C" {
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/timestamp.h"

PGDLLEXPORT void billguard_history_probe_main(Datum arg);
}

namespace billguard {

namespace {

// A probe waits this long for a background worker slot before the DROP
// DATABASE it guards is refused.
constexpr int kSlotWaitMs = 5000;

HistoryProbe Probe() {
  HistoryProbe probe;
  const std::vector<SqlRow> found = ExecuteInTransaction(
      "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'billguard'), "
      "to_regclass('billguard.billing_records') IS NOT NULL, "
      "to_regprocedure('billguard.billing_database_problem()') IS NOT NULL",
      {});
  probe.has_extension = found.at(0)[0].value_or("f") == "t";
  if (probe.has_extension && found.at(0)[1].value_or("f") == "t") {
    probe.billing_records =
        std::stoll(ExecuteInTransaction("SELECT count(*) FROM billguard.billing_records", {})
                       .at(0)[0]
                       .value_or("0"));
  }
  // Before 0.2.0 every database billed its history; once it is archived
  // there is none to ask about.
  if (probe.billing_records > 0 && found.at(0)[2].value_or("f") == "t") {
    probe.billing_database =
        !ExecuteInTransaction("SELECT billguard.billing_database_problem()", {})
             .at(0)[0]
             .has_value();
  }
  return probe;
}

}  // namespace

void ProbeHistory(Oid database, const char* name, bool* has_history, int64* billing_records) {
  BackgroundWorker worker =
      DatabaseWorker("billguard_history_probe_main", "billguard history probe of", name, database);
  strlcpy(worker.bgw_type, "billguard history probe", BGW_MAXLEN);
  snprintf(worker.bgw_extra, BGW_EXTRALEN, "%d", MyProcPid);
  BackgroundWorkerHandle* handle = nullptr;
  for (int waited = 0; !RegisterDynamicBackgroundWorker(&worker, &handle); waited += 100) {
    if (waited >= kSlotWaitMs) {
      ereport(
          ERROR,
          (errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
           errmsg("cannot tell whether database \"%s\" holds billguard's billing history", name),
           errdetail("No background worker slot is free for the probe that looks."),
           errhint("Retry, or raise max_worker_processes.")));
    }
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 100,
                    WaitEventOf(WaitFor::kProbeSlot));
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
  }
  (void)WaitForBackgroundWorkerShutdown(handle);
  pfree(handle);
  const HistoryProbe probe = TakeHistoryProbe(database);
  if (!probe.done || probe.error[0] != '\0') {
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("cannot tell whether database \"%s\" holds billguard's billing history", name),
             errdetail("%s", probe.done ? probe.error
                                        : "The probe that looks ended without an answer "
                                          "(see the server log).")));
  }
  *has_history = probe.has_extension && probe.billing_records > 0 && probe.billing_database;
  *billing_records = probe.billing_records;
}

}  // namespace billguard

extern "C" void billguard_history_probe_main(Datum arg) {
  billguard::InstallWorkerSignals(billguard::OnSigterm::kExitAtOnce);
  const Oid database = DatumGetObjectId(arg);
  const int holder = atoi(MyBgworkerEntry->bgw_extra);
  // Also a database that does not allow connections: the owner's way to a
  // DROP DATABASE is ALLOW_CONNECTIONS false first.
  BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, BGWORKER_BYPASS_ALLOWCONN);
  pgstat_report_appname("billguard history probe");
  billguard::GuardedCall("history probe", [&]() -> Datum {
    billguard::HistoryProbe probe;
    try {
      billguard::TakeDispatcherSettings(false);
      probe = billguard::Probe();
    } catch (const std::exception& failure) {
      strlcpy(probe.error, failure.what(), sizeof(probe.error));
    }
    probe.done = true;
    billguard::CallPostgres([&] { billguard::PublishHistoryProbe(database, holder, probe); });
    return 0;
  });
  proc_exit(0);
}
