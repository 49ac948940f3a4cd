// Running SQL statements in a transaction of their own from a background
// worker, with the results copied out as C++ strings. The PostgreSQL part
// runs inside CallPostgres, so an ERROR becomes a PostgresError exception
// (the transaction is then aborted).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace billguard {

using SqlValue = std::optional<std::string>;  // nullopt is SQL NULL
using SqlRow = std::vector<SqlValue>;

// One statement with text parameters $1..$n (cast them in the SQL). Each
// statement text is prepared once per process: pass the same few texts.
struct Statement {
  const char* sql;
  std::vector<SqlValue> params;
};

// Executes the statements in order in one transaction, committed before
// returning; the rows of each.
std::vector<std::vector<SqlRow>> ExecuteAllInTransaction(const std::vector<Statement>& statements);

// One statement in a transaction of its own.
std::vector<SqlRow> ExecuteInTransaction(const char* sql, const std::vector<SqlValue>& params);

}  // namespace billguard
