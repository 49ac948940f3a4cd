// The spend-cap ledger, as the proxy calls it: one SQL function of the
// billguard extension per decision (sql/install/8*_vault_*.sql). Nothing is
// decided here; this file turns rows and SQL errors into C++ values.
#pragma once

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "database_pool.hpp"
#include "ledger_counters.hpp"

namespace billguard::proxy {

class SettleQueue;

// What the proxy decides about reserved keys over time, and what the
// issuer token may ask for: the operator's flags (command_line.hpp).
struct LedgerPolicy {
  // How long Stripe is trusted to remember an Idempotency-Key (it keeps
  // one at least 24 hours): a key still reserved past it is reconciled
  // with Stripe before anything is forwarded again.
  int idempotency_window_s = 23 * 3600;
  // How long after a key's last attempt no attempt of it can still be on
  // its way: only then may Stripe's silence about it mean something.
  int reconcile_after_s = 120;
  // The issuer token's keys expire within this many days, and name billing
  // periods at most this many months from the current one.
  int issuer_max_key_days = 100;
  int issuer_period_months = 1;
};

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
  // hex SHA-256 of method, path, parameters and Stripe-Version (ledger_request.hpp)
  std::string request_digest;
  std::optional<long long> amount_cents;
  std::optional<std::string> currency;
  std::optional<std::string> customer;
  std::optional<std::string> search_key;  // metadata[billguard_key]
  // Stripe-Account: the connected account the request acts on; absent for
  // the platform's own. Its reservation is kept per account.
  std::optional<std::string> stripe_account;
};

// What the ledger knows of a reservation whose outcome the proxy must find
// out at Stripe.
struct ReservationInDoubt {
  std::string key_id;
  std::string idempotency_key;
  std::string endpoint;
  std::optional<std::string> customer;
  std::optional<std::string> search_key;
  int attempts = 0;                           // the attempt count the lookup starts from
  double reserved_at = 0;                     // Unix seconds
  double last_forwarded_at = 0;               // Unix seconds
  std::optional<std::string> stripe_account;  // looked up on that account
};

struct Authorization {
  // forwarded, reserved, reused, replayed, reconcile or refused
  std::string decision;
  int http_status = 0;  // for replayed and refused
  std::string body;     // for replayed and refused
  std::string key_id;
  std::string request_id;       // Stripe's Request-Id of a replayed answer
  int attempt = 0;              // of reserved and reused, for Settle
  bool should_retry = false;    // a refusal that is a throttle
  ReservationInDoubt in_doubt;  // of reconcile
  bool reserves() const { return decision == "reserved" || decision == "reused"; }
};

// What the proxy found at Stripe about a reservation in doubt.
struct Finding {
  enum class Kind { kFound, kAbsent, kUncertain };
  Kind kind = Kind::kUncertain;
  std::string charge_id;  // of kFound: the charged object, and its body
  std::string body;
  std::string request_id;
  std::string reason;  // for the audit trail and the proxy's 409
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
  std::optional<std::string> cap_usd;  // numeric text, e.g. 54890.10; for USD only
  std::string vendor;
  std::string currency;
  std::string cap;                   // numeric text in the currency's major unit: 5000, 1.250
  long long cap_cents = 0;           // in the currency's smallest unit
  std::string stripe_accounts_json;  // the budget's connected accounts, a JSON array
};

struct KeyRequest {
  std::string vendor;
  std::string billing_period;
  std::string currency = "usd";
  // One of the two, numeric text: a cap in USD, or in the currency's major unit.
  std::optional<std::string> period_usd_cap;
  std::optional<std::string> period_cap;
  std::vector<std::string> allowed_endpoints;
  std::vector<std::string> stripe_accounts;
  std::string expires_at;  // timestamptz text
  bool livemode = true;
  // The issuer token's request: the ledger allows it only the dispatcher's
  // key, and a new budget up to the operator's ceiling for the currency
  // (none given: no new budget in it).
  bool issuer = false;
  std::optional<std::string> issuer_max_period_usd;
  std::optional<std::string> issuer_max_period;  // in the currency asked
};

// Column name -> text (absent when NULL): a row of vault_spend.
using Row = std::vector<std::pair<std::string, std::optional<std::string>>>;

class Ledger {
 public:
  Ledger(const std::string& conninfo, std::size_t pool_size, LedgerPolicy policy,
         LedgerCounters& counters);
  ~Ledger();

  // Throws StartupError (secret_flags.hpp) when the database lacks the
  // extension, its ledger, or the role's privileges on it.
  void CheckSchema();

  Authorization Authorize(const ForwardedRequest& request);
  // Records Stripe's answer to attempt `attempt` (Authorization::attempt).
  // Never throws: what the database does not take now is kept and retried
  // until it does (settle_queue.hpp).
  void Settle(const std::string& key_id, const std::string& idempotency_key, int attempt,
              const UpstreamAnswer& answer, const std::optional<std::string>& stripe_account);
  // Records a finding (vault_reconcile): settled, released, unknown or stale.
  std::string Reconcile(const ReservationInDoubt& reservation, const Finding& finding);
  // Reserved keys with attempts in doubt and none for reconcile_after_s.
  std::vector<ReservationInDoubt> ReservationsInDoubt(int max_rows);
  NewKey IssueKey(const KeyRequest& request);
  // vault_key_status as a JSON object.
  std::string KeyStatus(const std::string& key_id);
  void RevokeKey(const std::string& key_id);
  void RaiseCap(const std::string& key_id, const std::string& period_usd_cap);
  std::vector<Row> Spend();
  void Ping();

  const LedgerPolicy& policy() const { return policy_; }
  LedgerCounters& counters() { return counters_; }

 private:
  template <typename Fn>
  auto Call(Fn&& fn, Retry retry = Retry::kOnce)
      -> decltype(fn(std::declval<pqxx::nontransaction&>()));
  void SettleNow(const std::string& key_id, const std::string& idempotency_key, int attempt,
                 const UpstreamAnswer& answer, const std::optional<std::string>& stripe_account);

  const LedgerPolicy policy_;
  LedgerCounters& counters_;
  DatabasePool pool_;
  std::unique_ptr<SettleQueue> settles_;
};

}  // namespace billguard::proxy
