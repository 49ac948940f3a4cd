// The C++ half of billguard.await_billing() (sql/install/58_await_billing.sql):
// reading a record's wake-up count, sleeping until a commit moves it, and
// telling whether the caller's own open transaction wrote the record (then
// no other session can finish it before the caller commits).
#include "postgres/sql_values.hpp"
#include "functions/terminal_wakeups.hpp"
#include "postgres/sql_function.hpp"

extern "C" {
#include "access/xact.h"
#include "utils/timestamp.h"
}

// billguard.terminal_commits(customer_id, billing_period) -> bigint: the
// count to pass to await_terminal_commit; NULL when billguard is not
// preloaded (nothing to wait on). STRICT.
BILLGUARD_SQL_FUNCTION(terminal_commits) {
  const auto commits = billguard::TerminalCommits(billguard::TextArgument(fcinfo, 0),
                                                  billguard::TextArgument(fcinfo, 1));
  if (!commits) PG_RETURN_NULL();
  return Int64GetDatum(static_cast<int64>(*commits));
}

// billguard.await_terminal_commit(customer_id, billing_period, seen, deadline)
// -> boolean: true once a commit beyond `seen` was announced for the
// record's slot, false when the deadline passed first. STRICT.
BILLGUARD_SQL_FUNCTION(await_terminal_commit) {
  const std::string_view customer_id = billguard::TextArgument(fcinfo, 0);
  const std::string_view billing_period = billguard::TextArgument(fcinfo, 1);
  const int64 seen = PG_GETARG_INT64(2);
  const TimestampTz deadline = PG_GETARG_TIMESTAMPTZ(3);
  if (!billguard::TerminalCommits(customer_id, billing_period)) {
    throw billguard::InvalidParameter(
        "await_terminal_commit needs billguard in shared_preload_libraries");
  }
  const bool announced = billguard::CallPostgres([&] {
    return billguard::AwaitTerminalCommit(customer_id, billing_period, static_cast<uint64>(seen),
                                          deadline);
  });
  return BoolGetDatum(announced);
}

// billguard.written_by_this_transaction(row_xmin xid) -> boolean: the row
// version was written by the caller's transaction (or one of its
// subtransactions), which has not committed. STRICT.
BILLGUARD_SQL_FUNCTION(written_by_this_transaction) {
  const TransactionId row_xmin = DatumGetTransactionId(PG_GETARG_DATUM(0));
  return BoolGetDatum(
      billguard::CallPostgres([&] { return TransactionIdIsCurrentTransactionId(row_xmin); }));
}
