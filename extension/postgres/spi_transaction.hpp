// Running one SQL statement in its own transaction from a background worker,
// with the results copied out as C++ strings. The PostgreSQL part runs inside
// CallPostgres, so an ERROR becomes a PostgresError exception (the
// transaction is then aborted).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace billguard {

using SqlValue = std::optional<std::string>;  // nullopt is SQL NULL
using SqlRow = std::vector<SqlValue>;

// Executes one statement with text parameters $1..$n (cast them in the SQL)
// in a transaction of its own, committed before returning; its rows. Each
// statement text is prepared once per process: pass the same few texts.
std::vector<SqlRow> ExecuteInTransaction(const char* sql, const std::vector<SqlValue>& params);

}  // namespace billguard
