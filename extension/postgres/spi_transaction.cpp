// One statement, one transaction, through SPI (see spi_transaction.hpp).
#include "postgres/spi_transaction.hpp"

#include "postgres/pg_boundary.hpp"

extern "C" {
#include "access/xact.h"
#include "catalog/pg_type_d.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
}

namespace billguard {

namespace {

// Results copied out of SPI memory into `context`, which outlives the
// transaction.
struct CopiedResult {
  uint64 rows = 0;
  int columns = 0;
  char** cells = nullptr;  // rows * columns, NULL for SQL NULL
};

// Prepared plans of the worker's statements, by statement text. The worker
// runs a handful of fixed statements thousands of times a second; planning
// each execution would cost more than executing it.
struct PreparedStatement {
  const char* sql;
  SPIPlanPtr plan;
};
PreparedStatement prepared[16];

// Plain PostgreSQL code: the kept plan for `sql`, prepared on first use.
SPIPlanPtr PlanFor(const char* sql, int nparams) {
  for (auto& p : prepared) {
    if (p.sql != nullptr && strcmp(p.sql, sql) == 0) return p.plan;
  }
  Oid* types = static_cast<Oid*>(palloc(sizeof(Oid) * (nparams > 0 ? nparams : 1)));
  for (int i = 0; i < nparams; ++i) types[i] = TEXTOID;
  SPIPlanPtr plan = SPI_prepare(sql, nparams, types);
  if (plan == nullptr)
    elog(ERROR, "billguard: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
  for (auto& p : prepared) {
    if (p.sql == nullptr) {
      SPI_keepplan(plan);
      p.sql = sql;
      p.plan = plan;
      break;
    }
  }
  return plan;  // unkept when the cache is full: freed with the SPI context
}

MemoryContext ResultContext() {
  static MemoryContext context = nullptr;
  if (context == nullptr) {
    context = AllocSetContextCreate(TopMemoryContext, "billguard statement results",
                                    ALLOCSET_DEFAULT_SIZES);
  }
  return context;
}

// The statement's parameters as PostgreSQL Datums, in ResultContext().
struct StatementArguments {
  const char* sql;
  int nparams;
  Datum* values;
  char* nulls;
};

// Plain PostgreSQL code: may ereport, owns no C++ objects. Runs the
// statement in a transaction of its own; `result` receives its rows.
void RunStatement(const StatementArguments& statement, CopiedResult* result) {
  MemoryContext out = ResultContext();
  SetCurrentStatementStartTimestamp();
  StartTransactionCommand();
  SPI_connect();
  PushActiveSnapshot(GetTransactionSnapshot());
  pgstat_report_activity(STATE_RUNNING, statement.sql);

  int rc = SPI_execute_plan(PlanFor(statement.sql, statement.nparams), statement.values,
                            statement.nulls, false, 0);
  if (rc < 0) elog(ERROR, "billguard: SPI_execute_plan failed: %s", SPI_result_code_string(rc));
  if (SPI_tuptable != nullptr) {
    result->rows = SPI_processed;
    result->columns = SPI_tuptable->tupdesc->natts;
    MemoryContext spi_context = MemoryContextSwitchTo(out);
    result->cells = static_cast<char**>(palloc0(
        sizeof(char*) * (result->rows * result->columns > 0 ? result->rows * result->columns : 1)));
    for (uint64 r = 0; r < result->rows; ++r) {
      for (int c = 0; c < result->columns; ++c) {
        result->cells[r * result->columns + c] =
            SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, c + 1);
      }
    }
    MemoryContextSwitchTo(spi_context);
  }
  SPI_freetuptable(SPI_tuptable);
  SPI_finish();
  PopActiveSnapshot();
  CommitTransactionCommand();
  // As PostgreSQL's own workers do after a transaction: without it
  // autovacuum never learns of the worker's updates and inserts while it
  // lives. At most once a second; the idle wait flushes the rest.
  pgstat_report_stat(false);
  pgstat_report_activity(STATE_IDLE, nullptr);
}

}  // namespace

std::vector<SqlRow> ExecuteInTransaction(const char* sql, const std::vector<SqlValue>& params) {
  const int nparams = static_cast<int>(params.size());
  StatementArguments arguments{sql, nparams, nullptr, nullptr};
  CallPostgres([&] {
    MemoryContext previous = MemoryContextSwitchTo(ResultContext());
    arguments.values = static_cast<Datum*>(palloc0(sizeof(Datum) * (nparams > 0 ? nparams : 1)));
    arguments.nulls = static_cast<char*>(palloc0(nparams + 1));
    for (int i = 0; i < nparams; ++i) {
      arguments.nulls[i] = params[i] ? ' ' : 'n';
      if (params[i])
        arguments.values[i] =
            PointerGetDatum(cstring_to_text_with_len(params[i]->data(), params[i]->size()));
    }
    MemoryContextSwitchTo(previous);
  });

  CopiedResult result;
  try {
    CallPostgres([&] { RunStatement(arguments, &result); });
  } catch (const PostgresError&) {
    // The error is the caller's to judge (a cancel at SIGTERM ends the
    // worker cleanly): leave no transaction behind.
    CallPostgres([] {
      AbortCurrentTransaction();
      pgstat_report_activity(STATE_IDLE, nullptr);
      MemoryContextReset(ResultContext());
    });
    throw;
  }

  std::vector<SqlRow> rows;
  rows.reserve(result.rows);
  for (uint64 r = 0; r < result.rows; ++r) {
    SqlRow row;
    row.reserve(result.columns);
    for (int c = 0; c < result.columns; ++c) {
      const char* cell = result.cells[r * result.columns + c];
      row.push_back(cell ? SqlValue(cell) : std::nullopt);
    }
    rows.push_back(std::move(row));
  }
  CallPostgres([] { MemoryContextReset(ResultContext()); });
  return rows;
}

}  // namespace billguard
