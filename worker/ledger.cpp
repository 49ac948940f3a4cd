// The ledger's SQL calls (see ledger.hpp).
#include "ledger.hpp"

#include "pqxx_compat.hpp"
#include "secret_flags.hpp"
#include "sha256.hpp"

namespace billguard::proxy {

namespace {

// Every statement is one call of a ledger function, run in its own
// transaction (autocommit): the function's work is atomic by itself.
void Prepare(pqxx::connection& connection) {
  connection.prepare(
      "authorize",
      "SELECT decision, http_status, body, key_id, request_id "
      "FROM billguard.vault_authorize($1::bytea, $2, $3, $4, $5, $6::bigint, $7, $8)");
  connection.prepare("settle",
                     "SELECT billguard.vault_settle($1, $2, $3::integer, $4, $5, $6, $7)");
  connection.prepare("issue",
                     "SELECT vault_key, key_id, cap_usd, vendor FROM billguard.issue_vault_key("
                     "$1, $2, $3::numeric, $4::text[], $5::timestamptz, $6::boolean, "
                     "$7::numeric)");
  connection.prepare("status", "SELECT row_to_json(s)::text FROM billguard.vault_key_status($1) s");
  connection.prepare("revoke", "SELECT billguard.revoke_vault_key($1)");
  connection.prepare("raise", "SELECT billguard.raise_vault_cap($1, $2::numeric)");
  connection.prepare("spend",
                     "SELECT vendor, billing_period, currency, cap_cents, settled_cents, "
                     "reserved_cents FROM billguard.vault_spend ORDER BY 1, 2, 3");
}

const char* OrNull(const std::optional<std::string>& value) {
  return value ? value->c_str() : nullptr;
}

std::string HexBytea(const std::string& bytes) {
  return "\\x" + LowerHex(bytes);
}

// A PostgreSQL array literal of text elements, each quoted.
std::string TextArray(const std::vector<std::string>& items) {
  std::string out = "{";
  for (const auto& item : items) {
    if (out.size() > 1) out.push_back(',');
    out.push_back('"');
    for (char c : item) {
      if (c == '"' || c == '\\') out.push_back('\\');
      out.push_back(c);
    }
    out.push_back('"');
  }
  return out + "}";
}

Row RowOf(const pqxx_compat::RowRef& row) {
  Row out;
  for (const auto& field : row) {
    out.emplace_back(field.name(),
                     field.is_null() ? std::nullopt : std::optional<std::string>(field.c_str()));
  }
  return out;
}

// SQLSTATE classes the ledger raises for a caller's mistake, as HTTP.
LedgerError ErrorFor(const pqxx::sql_error& e) {
  const std::string state = pqxx_compat::SqlState(e);
  const std::string message = pqxx_compat::ServerMessage(e);
  if (state == "23505") return LedgerError(409, "invalid_request_error", message);
  if (state == "P0002") return LedgerError(404, "invalid_request_error", message);
  // libpqxx 6.4 throws insufficient_privilege without its SQLSTATE.
  if (state == "42501" || dynamic_cast<const pqxx::insufficient_privilege*>(&e) != nullptr) {
    return LedgerError(403, "invalid_request_error", message);
  }
  if (state.rfind("22", 0) == 0 || state.rfind("23", 0) == 0) {
    return LedgerError(400, "invalid_request_error", message);
  }
  return LedgerError(500, "api_error", "the spend-cap ledger failed (SQLSTATE " + state + ")");
}

}  // namespace

Ledger::Ledger(const std::string& conninfo, std::size_t pool_size)
    : pool_(conninfo, pool_size, Prepare) {}

template <typename Fn>
auto Ledger::Call(Fn&& fn) -> decltype(fn(std::declval<pqxx::nontransaction&>())) {
  try {
    return pool_.Run([&](pqxx::connection& connection) {
      pqxx::nontransaction tx(connection);
      return fn(tx);
    });
  } catch (const pqxx::sql_error& e) {
    throw ErrorFor(e);
  }
}

void Ledger::CheckSchema() {
  static const char* const kFunctions[] = {
      "billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text)",
      "billguard.vault_settle(text, text, integer, text, text, text, text)",
      "billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean, numeric)",
      "billguard.vault_key_status(text)",
      "billguard.revoke_vault_key(text)",
      "billguard.raise_vault_cap(text, numeric)"};
  try {
    pool_.RunUnprepared([&](pqxx::connection& connection) {
      pqxx::nontransaction tx(connection);
      const auto version =
          pqxx_compat::OneRow(tx,
                              "SELECT current_database(), current_user, "
                              "(SELECT extversion FROM pg_extension WHERE extname = 'billguard')");
      const std::string where = "database " + version[0].as<std::string>();
      if (version[2].is_null()) {
        throw StartupError(where + " lacks the billguard extension: CREATE EXTENSION billguard");
      }
      const std::string role = version[1].as<std::string>();
      if (!pqxx_compat::OneRow(tx, "SELECT has_schema_privilege('billguard', 'USAGE')")[0]
               .as<bool>()) {
        throw StartupError("role " + role + " may not use schema billguard in " + where +
                           ": grant what the README's proxy section lists");
      }
      for (const char* function : kFunctions) {
        const auto found = pqxx_compat::OneRowWith(
            tx,
            "SELECT p IS NOT NULL, p IS NOT NULL AND has_function_privilege(p, 'EXECUTE') "
            "FROM to_regprocedure($1) p",
            function);
        if (!found[0].as<bool>()) {
          throw StartupError(where + " has billguard " + version[2].as<std::string>() +
                             " without the spend-cap ledger: ALTER EXTENSION billguard UPDATE");
        }
        if (!found[1].as<bool>()) {
          throw StartupError("role " + role + " may not call " + function + " in " + where +
                             ": grant what the README's proxy section lists");
        }
      }
      if (!pqxx_compat::OneRow(tx,
                               "SELECT has_table_privilege('billguard.vault_spend', 'SELECT')")[0]
               .as<bool>()) {
        throw StartupError("role " + role + " may not read billguard.vault_spend in " + where +
                           ": grant what the README's proxy section lists");
      }
      return 0;
    });
  } catch (const DatabaseUnavailable& e) {
    std::string message = e.what();
    message = message.substr(0, message.find('\n'));
    throw StartupError("cannot reach the --database: " + message);
  }
}

Authorization Ledger::Authorize(const ForwardedRequest& r) {
  return Call([&](pqxx::nontransaction& tx) {
    const std::optional<std::string> amount =
        r.amount_cents ? std::optional<std::string>(std::to_string(*r.amount_cents)) : std::nullopt;
    const auto row = pqxx_compat::OnePrepared(
        tx, "authorize", HexBytea(r.secret_sha256), r.method, r.endpoint, OrNull(r.idempotency_key),
        r.request_digest, OrNull(amount), OrNull(r.currency), OrNull(r.customer));
    Authorization a;
    a.decision = row[0].as<std::string>();
    a.http_status = row[1].is_null() ? 0 : row[1].as<int>();
    a.body = row[2].is_null() ? "" : row[2].as<std::string>();
    a.key_id = row[3].is_null() ? "" : row[3].as<std::string>();
    a.request_id = row[4].is_null() ? "" : row[4].as<std::string>();
    return a;
  });
}

std::string Ledger::Settle(const std::string& key_id, const std::string& idempotency_key,
                           const UpstreamAnswer& answer) {
  return Call([&](pqxx::nontransaction& tx) {
    return pqxx_compat::OnePrepared(tx, "settle", key_id, idempotency_key, answer.status,
                                    OrNull(answer.error_type), OrNull(answer.charge_id),
                                    answer.body, OrNull(answer.request_id))[0]
        .as<std::string>();
  });
}

NewKey Ledger::IssueKey(const KeyRequest& r) {
  return Call([&](pqxx::nontransaction& tx) {
    const auto row = pqxx_compat::OnePrepared(
        tx, "issue", r.vendor, r.billing_period, r.period_usd_cap, TextArray(r.allowed_endpoints),
        r.expires_at, r.livemode ? "true" : "false", OrNull(r.issuer_max_period_usd));
    return NewKey{row[0].as<std::string>(), row[1].as<std::string>(), row[2].as<std::string>(),
                  row[3].as<std::string>()};
  });
}

std::string Ledger::KeyStatus(const std::string& key_id) {
  return Call([&](pqxx::nontransaction& tx) {
    return pqxx_compat::OnePrepared(tx, "status", key_id)[0].as<std::string>();
  });
}

void Ledger::RevokeKey(const std::string& key_id) {
  Call([&](pqxx::nontransaction& tx) { return pqxx_compat::OnePrepared(tx, "revoke", key_id); });
}

void Ledger::RaiseCap(const std::string& key_id, const std::string& period_usd_cap) {
  Call([&](pqxx::nontransaction& tx) {
    return pqxx_compat::OnePrepared(tx, "raise", key_id, period_usd_cap);
  });
}

std::vector<Row> Ledger::Spend() {
  return Call([&](pqxx::nontransaction& tx) {
    std::vector<Row> rows;
    for (const auto& row : pqxx_compat::Prepared(tx, "spend")) rows.push_back(RowOf(row));
    return rows;
  });
}

void Ledger::Ping() {
  Call([&](pqxx::nontransaction& tx) { return pqxx_compat::OneRow(tx, "SELECT 1"); });
}

}  // namespace billguard::proxy
