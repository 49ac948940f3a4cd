// The spend-cap ledger, as the proxy calls it: one SQL function of the
// billguard extension per decision (sql/install/8*_vault_*.sql). Nothing is
// decided here; this file turns rows and SQL errors into C++ values.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "database_pool.hpp"

namespace billguard::proxy {

// An error of the ledger as the proxy answers it: an HTTP status and a
// Stripe error type, with the database's message (which never holds a secret).
class LedgerError : public std::runtime_error {
 public:
  LedgerError(int http_status, std::string type, const std::string& message)
      : std::runtime_error(message), http_status(http_status), type(std::move(type)) {}
  int http_status;
  std::string type;
};

// What vault_authorize needs of a request.
struct ForwardedRequest {
  std::string secret_sha256;  // raw 32 bytes
  std::string method;
  std::string endpoint;  // the path, /v1/...
  std::optional<std::string> idempotency_key;
  std::string request_digest;  // hex SHA-256 of method, path and parameters
  std::optional<long long> amount_cents;
  std::optional<std::string> currency;
  std::optional<std::string> customer;
};

struct Authorization {
  std::string decision;  // forwarded, reserved, reused, replayed or refused
  int http_status = 0;   // for replayed and refused
  std::string body;      // for replayed and refused
  std::string key_id;
  std::string request_id;  // Stripe's Request-Id of a replayed answer
  bool reserves() const { return decision == "reserved" || decision == "reused"; }
};

// Stripe's answer to a forwarded request, as vault_settle records it.
struct UpstreamAnswer {
  int status = 0;  // 0: no answer arrived
  std::optional<std::string> error_type;
  std::optional<std::string> charge_id;
  std::string body;
  std::optional<std::string> request_id;
};

struct NewKey {
  std::string vault_key;
  std::string key_id;
  std::string cap_usd;  // numeric text, e.g. 54890.10
  std::string vendor;
};

struct KeyRequest {
  std::string vendor;
  std::string billing_period;
  std::string period_usd_cap;  // numeric text
  std::vector<std::string> allowed_endpoints;
  std::string expires_at;  // timestamptz text
  bool livemode = true;
  // Set for the issuer token's request: the ledger allows it only the
  // dispatcher's key, and a new budget up to this many USD.
  std::optional<std::string> issuer_max_period_usd;
};

// Column name -> text (absent when NULL): a row of vault_spend.
using Row = std::vector<std::pair<std::string, std::optional<std::string>>>;

class Ledger {
 public:
  Ledger(const std::string& conninfo, std::size_t pool_size);

  // Throws StartupError (secret_flags.hpp) when the database lacks the
  // extension, its ledger, or the role's privileges on it.
  void CheckSchema();

  Authorization Authorize(const ForwardedRequest& request);
  std::string Settle(const std::string& key_id, const std::string& idempotency_key,
                     const UpstreamAnswer& answer);
  NewKey IssueKey(const KeyRequest& request);
  // vault_key_status as a JSON object.
  std::string KeyStatus(const std::string& key_id);
  void RevokeKey(const std::string& key_id);
  void RaiseCap(const std::string& key_id, const std::string& period_usd_cap);
  std::vector<Row> Spend();
  void Ping();

 private:
  template <typename Fn>
  auto Call(Fn&& fn) -> decltype(fn(std::declval<pqxx::nontransaction&>()));

  DatabasePool pool_;
};

}  // namespace billguard::proxy
