// billguard.dispatcher_state(): the dispatcher of the current database as it
// reports itself in shared memory, for the billguard.dispatch_status view;
// in a database no dispatcher serves, why not.
#include <string>

#include "postgres/pg_boundary.hpp"
#include "workers/served_databases.hpp"
#include "postgres/shared_state.hpp"
#include "postgres/sql_function.hpp"

extern "C" {
#include "access/htup_details.h"
#include "access/xlog.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
}

namespace billguard {

namespace {

// Why no dispatcher serves the current database; `report` has no running one.
std::string NotServedBecause(const ServiceReport& report) {
  if (!report.preloaded)
    return "billguard is not in shared_preload_libraries: no dispatcher runs on this server";
  const std::string reason = NotServedReason(CurrentDatabase());
  if (!reason.empty()) return "this database is not served: " + reason;
  if (CallPostgres([] { return RecoveryInProgress(); }))
    return "the server is in recovery: dispatchers start when it is promoted";
  if (!report.launcher_running) return "the billguard launcher is not running";
  if (report.out_of_worker_slots)
    return "no background worker slot is free for this database's dispatcher: billguard needs "
           "one for its launcher and one per database it serves (max_worker_processes = " +
           std::to_string(max_worker_processes) + ")";
  if (!report.has_entry && report.no_free_entry)
    return "billguard serves at most max_worker_processes (" +
           std::to_string(max_worker_processes) + ") databases";
  if (report.has_entry && report.entry.last_failure[0] != '\0') {
    const char* at = CallPostgres([&] { return timestamptz_to_str(report.entry.last_failure_at); });
    return "the dispatcher failed at its start or in its loop (" +
           std::to_string(report.entry.failures) + " times in a row, the last at " + at +
           "): " + report.entry.last_failure + "; the launcher starts it again every 2 s";
  }
  return "no dispatcher runs yet: the launcher starts one";
}

struct StateRow {
  int pid;
  TimestampTz started_at;
  DispatcherStatus status;
  bool wakeup_registered;
  char not_served[768];
};

StateRow CollectState() {
  const ServiceReport report = CallPostgres([] { return ReportService(MyDatabaseId); });
  StateRow row{};
  if (report.has_entry && report.entry.pid != 0) {
    row.pid = report.entry.pid;
    row.started_at = report.entry.started_at;
    row.status = report.entry.status;
  } else {
    strlcpy(row.not_served, NotServedBecause(report).c_str(), sizeof(row.not_served));
  }
  row.wakeup_registered = report.has_entry && report.entry.latch != nullptr;
  return row;
}

// Plain PostgreSQL code (it may ereport): builds the one-row result.
Datum BuildDispatcherState(FunctionCallInfo fcinfo, const StateRow& row) {
  TupleDesc descriptor;
  if (get_call_result_type(fcinfo, nullptr, &descriptor) != TYPEFUNC_COMPOSITE) {
    ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                    errmsg("dispatcher_state() must return a composite type")));
  }
  descriptor = BlessTupleDesc(descriptor);
  Datum values[10];
  bool nulls[10] = {false, false, false, false, false, false, false, false, false, false};
  values[0] = Int32GetDatum(row.pid);
  nulls[0] = row.pid == 0;
  values[1] = TimestampTzGetDatum(row.started_at);
  nulls[1] = row.pid == 0;
  values[2] = BoolGetDatum(row.status.paused);
  values[3] = CStringGetTextDatum(row.status.pause_reason);
  nulls[3] = row.status.pause_reason[0] == '\0';
  values[4] = Int32GetDatum(row.status.in_flight);
  values[5] = Int64GetDatum(row.status.requests_sent);
  values[6] = BoolGetDatum(row.wakeup_registered);
  values[7] = CStringGetTextDatum(row.not_served);
  nulls[7] = row.not_served[0] == '\0';
  values[8] = CStringGetTextDatum(row.status.waiting_for);
  nulls[8] = row.status.waiting_for[0] == '\0';
  values[9] = CStringGetTextDatum(row.status.scheduler_pause_reason);
  nulls[9] = row.status.scheduler_pause_reason[0] == '\0';
  return HeapTupleGetDatum(heap_form_tuple(descriptor, values, nulls));
}

}  // namespace

}  // namespace billguard

BILLGUARD_SQL_FUNCTION(dispatcher_state) {
  const billguard::StateRow row = billguard::CollectState();
  return billguard::CallPostgres([&] { return billguard::BuildDispatcherState(fcinfo, row); });
}
