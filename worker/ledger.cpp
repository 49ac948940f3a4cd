// The ledger's SQL calls (see ledger.hpp).
#include "ledger.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>

#include "pqxx_compat.hpp"
#include "secret_flags.hpp"
#include "settle_queue.hpp"
#include "sha256.hpp"

namespace billguard::proxy {

namespace {

// Every statement is one call of a ledger function, run in its own
// transaction (autocommit): the function's work is atomic by itself.
void Prepare(pqxx::connection& connection) {
  connection.prepare("authorize",
                     "SELECT decision, http_status, body, key_id, request_id, attempt, "
                     "should_retry FROM billguard.vault_authorize($1::bytea, $2, $3, $4, $5, "
                     "$6::bigint, $7, $8, $9, make_interval(secs => $10::integer), $11)");
  connection.prepare(
      "settle",
      "SELECT billguard.vault_settle($1, $2, $3::integer, $4, $5, $6, $7, $8::integer, "
      "$9)");
  connection.prepare(
      "reconcile", "SELECT billguard.vault_reconcile($1, $2, $3::integer, $4, $5, $6, $7, $8, $9)");
  connection.prepare("in_doubt",
                     "SELECT key_id, idempotency_key, endpoint, customer, search_key, attempts, "
                     "reserved_at, last_forwarded_at, stripe_account FROM "
                     "billguard.vault_reservations_in_doubt(make_interval(secs => $1::integer), "
                     "$2::integer)");
  connection.prepare("issue",
                     "SELECT vault_key, key_id, cap_usd, vendor, currency, cap, cap_cents, "
                     "array_to_json(stripe_accounts)::text FROM billguard.issue_vault_key("
                     "$1, $2, $3::numeric, $4::text[], $5::timestamptz, $6::boolean, "
                     "$7::numeric, $8::integer, $9::integer, $10, $11::numeric, $12::text[], "
                     "$13::numeric)");
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

// Bounds of the settles kept in memory: far more than the requests in
// flight when the database goes away (a settle can only fail for a request
// authorized before), and little memory at Stripe's answer sizes.
constexpr std::size_t kMaxKeptSettles = 10000;
constexpr std::size_t kMaxKeptSettleBytes = 64u << 20;

std::optional<std::string> TextOrNone(const nlohmann::json& object, const char* name) {
  const auto found = object.find(name);
  if (found == object.end() || !found->is_string()) return std::nullopt;
  return found->get<std::string>();
}

// The body of vault_authorize's reconcile decision: what the ledger knows.
ReservationInDoubt InDoubtOf(const std::string& body, const std::string& idempotency_key) {
  const nlohmann::json known = nlohmann::json::parse(body);
  ReservationInDoubt r;
  r.key_id = known.at("key_id").get<std::string>();
  r.idempotency_key = idempotency_key;
  r.endpoint = known.at("endpoint").get<std::string>();
  r.customer = TextOrNone(known, "customer");
  r.search_key = TextOrNone(known, "search_key");
  r.attempts = known.at("attempts").get<int>();
  r.reserved_at = known.at("reserved_at").get<double>();
  r.last_forwarded_at = known.at("last_forwarded_at").get<double>();
  return r;
}

const char* FindingName(Finding::Kind kind) {
  switch (kind) {
    case Finding::Kind::kFound:
      return "found";
    case Finding::Kind::kAbsent:
      return "absent";
    case Finding::Kind::kUncertain:
      break;
  }
  return "uncertain";
}

}  // namespace

Ledger::Ledger(const std::string& conninfo, std::size_t pool_size, LedgerPolicy policy,
               LedgerCounters& counters)
    : policy_(policy),
      counters_(counters),
      pool_(conninfo, pool_size, Prepare, &counters.connections_replaced, &counters.calls_retried),
      settles_(std::make_unique<SettleQueue>(
          [this](const PendingSettle& s) {
            try {
              SettleNow(s.key_id, s.idempotency_key, s.attempt, s.answer, s.stripe_account);
            } catch (const LedgerError& e) {
              // Refused for good (22023, P0002): retrying cannot help.
              if (e.http_status == 500) throw;
              ++counters_.settles_dropped;
              std::fprintf(stderr, "billguard-proxy: settle of %s attempt %d refused: %s\n",
                           s.idempotency_key.c_str(), s.attempt, e.what());
            }
          },
          counters, kMaxKeptSettles, kMaxKeptSettleBytes)) {}

Ledger::~Ledger() = default;

// Every ledger call is one statement in its own transaction: one that
// broke under it is retried once where a repeat is harmless (retry).
template <typename Fn>
auto Ledger::Call(Fn&& fn, Retry retry) -> decltype(fn(std::declval<pqxx::nontransaction&>())) {
  try {
    return pool_.Run(
        [&](pqxx::connection& connection) {
          pqxx::nontransaction tx(connection);
          return fn(tx);
        },
        retry);
  } catch (const pqxx::sql_error& e) {
    throw ErrorFor(e);
  }
}

void Ledger::CheckSchema() {
  static const char* const kFunctions[] = {
      "billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text, text, "
      "interval, text)",
      "billguard.vault_settle(text, text, integer, text, text, text, text, integer, text)",
      "billguard.vault_reconcile(text, text, integer, text, text, text, text, text, text)",
      "billguard.vault_reservations_in_doubt(interval, integer)",
      "billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean, numeric, "
      "integer, integer, text, numeric, text[], numeric)",
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
                           ": grant what docs/privileges.md lists for the proxy's role");
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
                             ": grant what docs/privileges.md lists for the proxy's role");
        }
      }
      if (!pqxx_compat::OneRow(tx,
                               "SELECT has_table_privilege('billguard.vault_spend', 'SELECT')")[0]
               .as<bool>()) {
        throw StartupError("role " + role + " may not read billguard.vault_spend in " + where +
                           ": grant what docs/privileges.md lists for the proxy's role");
      }
      return 0;
    });
  } catch (const DatabaseUnavailable& e) {
    std::string message = e.what();
    message = message.substr(0, message.find('\n'));
    throw StartupError("cannot reach the --database: " + message);
  }
}

// Retried once on a broken connection: had the first run committed, the
// second finds its reservation and reuses it, counted once (its attempt
// stays in doubt: the cautious side).
Authorization Ledger::Authorize(const ForwardedRequest& r) {
  return Call([&](pqxx::nontransaction& tx) {
    const std::optional<std::string> amount =
        r.amount_cents ? std::optional<std::string>(std::to_string(*r.amount_cents)) : std::nullopt;
    const auto row = pqxx_compat::OnePrepared(
        tx, "authorize", HexBytea(r.secret_sha256), r.method, r.endpoint, OrNull(r.idempotency_key),
        r.request_digest, OrNull(amount), OrNull(r.currency), OrNull(r.customer),
        OrNull(r.search_key), policy_.idempotency_window_s, OrNull(r.stripe_account));
    Authorization a;
    a.decision = row[0].as<std::string>();
    a.http_status = row[1].is_null() ? 0 : row[1].as<int>();
    a.body = row[2].is_null() ? "" : row[2].as<std::string>();
    a.key_id = row[3].is_null() ? "" : row[3].as<std::string>();
    a.request_id = row[4].is_null() ? "" : row[4].as<std::string>();
    a.attempt = row[5].is_null() ? 0 : row[5].as<int>();
    a.should_retry = !row[6].is_null() && row[6].as<bool>();
    if (a.decision == "reconcile") {
      a.in_doubt = InDoubtOf(a.body, r.idempotency_key.value_or(""));
      a.in_doubt.stripe_account = r.stripe_account;
    }
    return a;
  });
}

// Answering an attempt twice changes nothing: safe to retry.
void Ledger::SettleNow(const std::string& key_id, const std::string& idempotency_key, int attempt,
                       const UpstreamAnswer& answer,
                       const std::optional<std::string>& stripe_account) {
  Call([&](pqxx::nontransaction& tx) {
    return pqxx_compat::OnePrepared(tx, "settle", key_id, idempotency_key, answer.status,
                                    OrNull(answer.error_type), OrNull(answer.charge_id),
                                    answer.body, OrNull(answer.request_id), attempt,
                                    OrNull(stripe_account));
  });
}

void Ledger::Settle(const std::string& key_id, const std::string& idempotency_key, int attempt,
                    const UpstreamAnswer& answer,
                    const std::optional<std::string>& stripe_account) {
  std::string why;
  try {
    return SettleNow(key_id, idempotency_key, attempt, answer, stripe_account);
  } catch (const LedgerError& e) {
    if (e.http_status != 500) {
      ++counters_.settles_dropped;
      std::fprintf(stderr, "billguard-proxy: settle of %s attempt %d of %s refused: %s\n",
                   idempotency_key.c_str(), attempt, key_id.c_str(), e.what());
      return;
    }
    why = e.what();
  } catch (const DatabaseUnavailable& e) {
    why = e.what();
  }
  const bool kept =
      settles_->Keep(PendingSettle{key_id, idempotency_key, attempt, answer, stripe_account});
  std::fprintf(stderr, "billguard-proxy: could not settle %s attempt %d of %s now (%s): %s\n",
               idempotency_key.c_str(), attempt, key_id.c_str(),
               why.substr(0, why.find('\n')).c_str(),
               kept ? "kept, and retried until the database takes it"
                    : "no room to keep it; its attempt stays in doubt for the reconciler");
}

// A finding is a fact about Stripe, and recording it twice changes nothing.
std::string Ledger::Reconcile(const ReservationInDoubt& r, const Finding& f) {
  const bool found = f.kind == Finding::Kind::kFound;
  const std::optional<std::string> charge_id =
      found ? std::optional<std::string>(f.charge_id) : std::nullopt;
  const std::optional<std::string> body = found ? std::optional<std::string>(f.body) : std::nullopt;
  const std::optional<std::string> request_id =
      found && !f.request_id.empty() ? std::optional<std::string>(f.request_id) : std::nullopt;
  return Call([&](pqxx::nontransaction& tx) {
    return pqxx_compat::OnePrepared(tx, "reconcile", r.key_id, r.idempotency_key, r.attempts,
                                    FindingName(f.kind), OrNull(charge_id), OrNull(body),
                                    OrNull(request_id), f.reason, OrNull(r.stripe_account))[0]
        .as<std::string>();
  });
}

std::vector<ReservationInDoubt> Ledger::ReservationsInDoubt(int max_rows) {
  return Call([&](pqxx::nontransaction& tx) {
    std::vector<ReservationInDoubt> found;
    // A field of a row, whatever type libpqxx gives it (pqxx_compat::RowRef).
    const auto optional = [](const auto& f) {
      return f.is_null() ? std::nullopt : std::optional<std::string>(f.c_str());
    };
    for (const auto& row :
         pqxx_compat::Prepared(tx, "in_doubt", policy_.reconcile_after_s, max_rows)) {
      ReservationInDoubt r;
      r.key_id = row[0].as<std::string>();
      r.idempotency_key = row[1].as<std::string>();
      r.endpoint = row[2].as<std::string>();
      r.customer = optional(row[3]);
      r.search_key = optional(row[4]);
      r.attempts = row[5].as<int>();
      r.reserved_at = row[6].as<double>();
      r.last_forwarded_at = row[7].as<double>();
      r.stripe_account = optional(row[8]);
      found.push_back(std::move(r));
    }
    return found;
  });
}

// Never retried: had the first run committed, a second key would be
// issued (its secret never answered to anyone).
NewKey Ledger::IssueKey(const KeyRequest& r) {
  const bool issuer = r.issuer;
  const std::optional<std::string> max_days =
      issuer ? std::optional<std::string>(std::to_string(policy_.issuer_max_key_days))
             : std::nullopt;
  const std::optional<std::string> months =
      issuer ? std::optional<std::string>(std::to_string(policy_.issuer_period_months))
             : std::nullopt;
  return Call(
      [&](pqxx::nontransaction& tx) {
        const auto row = pqxx_compat::OnePrepared(
            tx, "issue", r.vendor, r.billing_period, OrNull(r.period_usd_cap),
            TextArray(r.allowed_endpoints), r.expires_at, r.livemode ? "true" : "false",
            OrNull(r.issuer_max_period_usd), OrNull(max_days), OrNull(months), r.currency,
            OrNull(r.period_cap), TextArray(r.stripe_accounts), OrNull(r.issuer_max_period));
        NewKey key;
        key.vault_key = row[0].as<std::string>();
        key.key_id = row[1].as<std::string>();
        if (!row[2].is_null()) key.cap_usd = row[2].as<std::string>();
        key.vendor = row[3].as<std::string>();
        key.currency = row[4].as<std::string>();
        key.cap = row[5].as<std::string>();
        key.cap_cents = row[6].as<long long>();
        key.stripe_accounts_json = row[7].as<std::string>();
        return key;
      },
      Retry::kNever);
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
