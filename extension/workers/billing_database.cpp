// Whether this database bills its history (see billing_database.hpp).
#include "workers/billing_database.hpp"

#include "settings/settings.hpp"
#include "postgres/pg_boundary.hpp"
#include "postgres/shared_state.hpp"
#include "postgres/spi_transaction.hpp"
#include "postgres/sql_function.hpp"

extern "C" {
#include "miscadmin.h"
#include "utils/guc.h"
}

namespace billguard {

namespace {

bool creating_in_restore = false;

}  // namespace

std::string BillingDatabaseProblem() {
  const std::vector<SqlRow> rows =
      ExecuteInTransaction("SELECT billguard.billing_database_problem()", {});
  return rows.empty() || !rows[0][0] ? "" : *rows[0][0];
}

bool HasCustomers() {
  const std::vector<SqlRow> rows = ExecuteInTransaction(
      "SELECT EXISTS (SELECT FROM billguard.billing_records) "
      "OR EXISTS (SELECT FROM billguard.accounts)",
      {});
  return !rows.empty() && rows[0][0].value_or("f") == "t";
}

std::string KeyNamespaceConflict(bool bills) {
  const Oid first = CallPostgres([&] { return ClaimKeyNamespace(bills, settings::key_namespace); });
  if (first == InvalidOid) return "";
  const std::vector<SqlRow> rows = ExecuteInTransaction(
      "SELECT datname FROM pg_catalog.pg_database WHERE oid = $1::oid", {std::to_string(first)});
  const std::string other =
      rows.empty() || !rows[0][0] ? "OID " + std::to_string(first) : "\"" + *rows[0][0] + "\"";
  return "database " + other + " of this cluster bills with the same billguard.key_namespace ('" +
         std::string(settings::key_namespace) +
         "'): the two would share every idempotency key at Stripe, so this one, created later, "
         "sends nothing and bills no period; give it a namespace of its own (ALTER DATABASE ... "
         "SET billguard.key_namespace) or stop billing one of them";
}

void NoteCreateExtensionSession() {
  creating_in_restore = !check_function_bodies || (application_name != nullptr &&
                                                   strcmp(application_name, "pg_restore") == 0);
}

void ForgetCreateExtensionSession() {
  creating_in_restore = false;
}

}  // namespace billguard

// billguard.created_by_restore(): whether the CREATE EXTENSION billguard
// running now is part of a restore (see NoteCreateExtensionSession); false
// without preloading, when no dispatcher could bill during the restore.
BILLGUARD_SQL_FUNCTION(created_by_restore) {
  PG_RETURN_BOOL(billguard::creating_in_restore);
}
