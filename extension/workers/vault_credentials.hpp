// The dispatcher's vault keys: the key each request is sent with, and the
// exchange that obtains a period's key from billguard-proxy (POST /keys)
// through billguard.vault_credentials (sql/install/83_vault_credentials.sql).
// Each SQL call is one short transaction; none is open while the proxy is
// asked for a key, and the asking is one more transfer of the dispatcher's
// HTTP client, so the charges in flight keep moving while it is answered.
#pragma once

#include "common/http_client.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace billguard {

// A budget's vault key, as kept for the proxy at api_base.
struct VaultCredential {
  std::string key_id;
  std::string vault_key;    // the secret: never logged
  long long cap_cents = 0;  // in the currency's smallest unit
  std::string cap_text;     // as people read it: "55.00 USD", "5000 JPY"
};

// The currency of a charge's form-encoded body (its `currency` parameter),
// "usd" when it names none: the budget its request spends.
std::string ChargeCurrency(const std::string& form_body);

std::optional<VaultCredential> LookupVaultCredential(const std::string& api_base,
                                                     const std::string& billing_period,
                                                     const std::string& currency);

// The POST /keys body for the period's budget in `currency`
// (billguard.vault_key_request), and the cap it asks in the currency's
// smallest unit: the period's total in it times headroom, or cap_cents when
// given (to join a budget that has it).
struct VaultKeyAsk {
  std::string json_body;
  long long cap_cents = 0;
  std::string cap_text;
};
VaultKeyAsk VaultKeyRequestBody(const std::string& billing_period, const std::string& currency,
                                const std::string& endpoint, double headroom,
                                std::optional<long long> cap_cents);

void StoreVaultCredential(const std::string& api_base, const std::string& billing_period,
                          const std::string& currency, const VaultCredential& credential);
void ForgetVaultCredential(const std::string& api_base, const std::string& billing_period,
                           const std::string& currency, const std::string& key_id);

// What an answer to POST /keys asks of the dispatcher.
struct VaultKeyAnswer {
  enum class Next {
    kNothing,  // a key was obtained (or is asked for again), or the answer is stale
    kPause,    // refused (a 4xx): wait for a person, with `why`
    kHoldOff,  // the proxy failed or is unreachable: try again later, with `why`
  };
  Next next = Next::kNothing;
  std::string why;
};

// The keys requests are sent with: api_key_file's one key, or through the
// proxy (billguard.vault_issuer_token_file set) the vault key of each
// period and currency (the proxy's budgets are per period and currency),
// kept in memory, else in billguard.vault_credentials, else obtained.
class VaultKeys {
 public:
  explicit VaultKeys(const char* user_agent) : user_agent_(user_agent) {}

  // Reads the key file or the issuer token file named by the settings and
  // forgets the keys in memory; an answer to a key asked for before is then
  // dropped (the key it brings is issued again, joining the same budget).
  // Why neither holds a usable secret, "" when one does.
  std::string Load();
  bool through_proxy() const { return through_proxy_; }

  // The key a request of `period` in `currency` is sent with, or nullptr
  // while it is being obtained: the first call for a budget without one
  // submits POST /keys on `http`, whose answer comes back from http.Poll.
  const VaultCredential* KeyFor(const std::string& period, const std::string& currency,
                                HttpClient& http);
  // Whether a response is to POST /keys: their tags have kKeyTag set,
  // charges' never do.
  static bool IsKeyAnswer(const HttpResponse& response) { return (response.tag & kKeyTag) != 0; }
  VaultKeyAnswer TakeAnswer(const HttpResponse& response, HttpClient& http);
  // Whether a POST /keys is outstanding.
  bool Asking() const { return !asking_.empty(); }
  bool AskingFor(const std::string& period, const std::string& currency) const {
    return asking_by_budget_.count(Budget(period, currency)) != 0;
  }

  // A key the proxy said expired (401 vault_key_expired) is forgotten, so
  // that the next request of the period obtains a new one; unless a new one
  // was obtained already since the request was sent with `key_id`.
  void ForgetExpired(const std::string& period, const std::string& currency,
                     const std::string& key_id);
  // A key the proxy refused for a connected account its budget does not
  // name (403 stripe_account_not_allowed: a record of that account claimed
  // after the key was obtained) is forgotten the same way: the next key's
  // request names every account of the period's records of the currency,
  // which the budget then allows. False, and nothing forgotten, when the
  // refused key was itself obtained so: the account is refused for another
  // reason, which a person must see (the caller pauses).
  bool ForgetForAccount(const std::string& period, const std::string& currency,
                        const std::string& key_id);
  // "the period's vault cap is 110.00 EUR (vault key K)", for a blocked record.
  std::string DescribeCap(const std::string& period, const std::string& currency) const;

  static constexpr std::uint64_t kKeyTag = std::uint64_t{1} << 63;

 private:
  struct PendingAsk {
    std::string period;
    std::string currency;
    VaultKeyAsk ask;
    bool at_existing_cap = false;  // asked again at the budget's cap (after a 409)
  };
  void Ask(PendingAsk asking, HttpClient& http);
  static std::string Budget(const std::string& period, const std::string& currency) {
    return period + "/" + currency;
  }

  const char* user_agent_;
  VaultCredential direct_key_;  // api_key_file's key, when not through the proxy
  bool through_proxy_ = false;
  std::string issuer_token_;
  std::unordered_map<std::string, VaultCredential> keys_;  // by Budget(period, currency)
  std::unordered_map<std::uint64_t, PendingAsk> asking_;   // by tag
  std::unordered_map<std::string, std::uint64_t> asking_by_budget_;
  // Budgets whose key was forgotten for an account refusal: the next key
  // obtained for one is recorded in keys_for_accounts_.
  std::unordered_set<std::string> rekeying_for_accounts_;
  std::unordered_set<std::string> keys_for_accounts_;
  std::uint64_t next_tag_ = 1;
};

}  // namespace billguard
