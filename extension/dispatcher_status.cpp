// billguard.dispatcher_state(): what the dispatcher reports about itself in
// shared memory, for the billguard.dispatch_status view.
#include "pg_boundary.hpp"
#include "shared_state.hpp"

extern "C" {
#include "access/htup_details.h"
#include "funcapi.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(billguard_dispatcher_state);
}

namespace {

// Plain PostgreSQL code (it may ereport): builds the one-row result.
Datum BuildDispatcherState(FunctionCallInfo fcinfo) {
  TupleDesc descriptor;
  if (get_call_result_type(fcinfo, nullptr, &descriptor) != TYPEFUNC_COMPOSITE) {
    ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                    errmsg("dispatcher_state() must return a composite type")));
  }
  descriptor = BlessTupleDesc(descriptor);
  Datum values[7];
  bool nulls[7] = {false, false, false, false, false, false, false};
  billguard::SharedState* shared = billguard::Shared();
  if (shared == nullptr) {
    for (bool& n : nulls) n = true;  // not preloaded: nothing to report
  } else {
    SpinLockAcquire(&shared->mutex);
    const int pid = shared->dispatcher_pid;
    const TimestampTz started = shared->dispatcher_started_at;
    const bool paused = shared->paused;
    char reason[billguard::kPauseReasonSize];
    memcpy(reason, shared->pause_reason, sizeof(reason));
    const int in_flight = shared->in_flight;
    const int64 sent = shared->requests_sent;
    const bool wakeup_registered = shared->dispatcher_latch != nullptr;
    SpinLockRelease(&shared->mutex);
    values[0] = Int32GetDatum(pid);
    nulls[0] = pid == 0;
    values[1] = TimestampTzGetDatum(started);
    nulls[1] = pid == 0;
    values[2] = BoolGetDatum(paused);
    values[3] = CStringGetTextDatum(reason);
    nulls[3] = reason[0] == '\0';
    values[4] = Int32GetDatum(in_flight);
    values[5] = Int64GetDatum(sent);
    values[6] = BoolGetDatum(wakeup_registered);
  }
  return HeapTupleGetDatum(heap_form_tuple(descriptor, values, nulls));
}

}  // namespace

extern "C" Datum billguard_dispatcher_state(PG_FUNCTION_ARGS) {
  return billguard::GuardedCall("dispatcher_state", [&]() -> Datum {
    return billguard::CallPostgres([&] { return BuildDispatcherState(fcinfo); });
  });
}
