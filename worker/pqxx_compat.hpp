// Every difference between the libpqxx versions the proxy builds against, in
// one place: Debian bookworm's 6.4, trixie's 7.10 and forky's 8.0. Each
// condition names the version that changed and what changed; the rest of
// the proxy calls these names and never tests PQXX_VERSION itself.
#pragma once

#include <pqxx/pqxx>
#include <pqxx/version>

#include <string>
#include <utility>

// 7.10 deprecates exec1, exec_params1 and exec_prepared1 (and 8.0 drops
// them) for exec(query[, params]) and exec(prepped, params), which 6.4 lacks.
#if PQXX_VERSION_MAJOR > 7 || (PQXX_VERSION_MAJOR == 7 && PQXX_VERSION_MINOR >= 10)
#define BILLGUARD_PQXX_EXEC_PARAMS 1
#endif

namespace billguard::proxy::pqxx_compat {

// 8.0: iterating a result yields row_ref, a view of the row, not a row.
#if PQXX_VERSION_MAJOR >= 8
using RowRef = pqxx::row_ref;
#else
using RowRef = pqxx::row;
#endif

// The one row of a query that has no parameters.
inline pqxx::row OneRow(pqxx::transaction_base& tx, const std::string& query) {
#ifdef BILLGUARD_PQXX_EXEC_PARAMS
  return tx.exec(query).one_row();
#else
  return tx.exec1(query);
#endif
}

// The one row of a query with parameters ($1, $2, ...); a null char
// pointer is SQL NULL.
template <typename... Args>
pqxx::row OneRowWith(pqxx::transaction_base& tx, const std::string& query, Args&&... args) {
#ifdef BILLGUARD_PQXX_EXEC_PARAMS
  return tx.exec(query, pqxx::params{std::forward<Args>(args)...}).one_row();
#else
  return tx.exec_params1(query, std::forward<Args>(args)...);
#endif
}

// The rows of a prepared statement.
template <typename... Args>
pqxx::result Prepared(pqxx::transaction_base& tx, const std::string& statement, Args&&... args) {
#ifdef BILLGUARD_PQXX_EXEC_PARAMS
  return tx.exec(pqxx::prepped{statement}, pqxx::params{std::forward<Args>(args)...});
#else
  return tx.exec_prepared(statement, std::forward<Args>(args)...);
#endif
}

// The one row of a prepared statement.
template <typename... Args>
pqxx::row OnePrepared(pqxx::transaction_base& tx, const std::string& statement, Args&&... args) {
#ifdef BILLGUARD_PQXX_EXEC_PARAMS
  return Prepared(tx, statement, std::forward<Args>(args)...).one_row();
#else
  return tx.exec_prepared1(statement, std::forward<Args>(args)...);
#endif
}

// 8.0: sqlstate() returns a string_view (before: a std::string).
inline std::string SqlState(const pqxx::sql_error& e) {
  return std::string(e.sqlstate());
}

// The first line of the server's message, as a client should show it:
// 7.0 prefixes what() with "Failure during '<statement>': ", every version
// with the severity ("ERROR:  ").
inline std::string ServerMessage(const pqxx::sql_error& e) {
  std::string message = e.what();
  constexpr const char kDuring[] = "Failure during '";
  if (message.rfind(kDuring, 0) == 0) {
    const auto end = message.find("': ");
    if (end != std::string::npos) message = message.substr(end + 3);
  }
  if (message.rfind("ERROR:  ", 0) == 0) message = message.substr(8);
  return message.substr(0, message.find('\n'));
}

}  // namespace billguard::proxy::pqxx_compat
