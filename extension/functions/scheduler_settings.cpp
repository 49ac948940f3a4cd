// billguard.scheduler_settings(): the scheduler's settings and its notion of
// now, for the SQL that computes its calendar (sql/install/57_scheduler.sql).
// A C function, so that a session that has not loaded billguard yet gets
// the settings defined rather than an unrecognized parameter.
#include "settings/settings.hpp"
#include "postgres/pg_boundary.hpp"
#include "postgres/sql_function.hpp"

extern "C" {
#include "access/htup_details.h"
#include "access/xact.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
}

namespace {

// Plain PostgreSQL code (it may ereport). scheduler_now was checked when it
// was set, so reading it cannot fail; unset, now is the transaction's start.
Datum BuildSchedulerSettings(FunctionCallInfo fcinfo) {
  using namespace billguard::settings;
  TupleDesc descriptor;
  if (get_call_result_type(fcinfo, nullptr, &descriptor) != TYPEFUNC_COMPOSITE) {
    ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                    errmsg("scheduler_settings() must return a composite type")));
  }
  descriptor = BlessTupleDesc(descriptor);
  Datum values[4];
  bool nulls[4] = {false, false, false, false};
  values[0] = CStringGetTextDatum(auto_bill == kAutoBillMonthly ? "monthly" : "off");
  values[1] = Int32GetDatum(bill_day);
  values[2] = Int32GetDatum(bill_hour_utc);
  values[3] = scheduler_now[0] == '\0'
                  ? TimestampTzGetDatum(GetCurrentTransactionStartTimestamp())
                  : DirectFunctionCall3(timestamptz_in, CStringGetDatum(scheduler_now),
                                        ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1));
  return HeapTupleGetDatum(heap_form_tuple(descriptor, values, nulls));
}

}  // namespace

BILLGUARD_SQL_FUNCTION(scheduler_settings) {
  return billguard::CallPostgres([&] { return BuildSchedulerSettings(fcinfo); });
}
