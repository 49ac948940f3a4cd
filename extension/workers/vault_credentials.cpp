// The dispatcher's vault keys (see vault_credentials.hpp): typed calls of
// the vault-credential SQL, and the POST /keys exchange.
#include "workers/vault_credentials.hpp"

#include "common/api_key.hpp"
#include "common/issuer_token.hpp"
#include "common/vault_key_request.hpp"

#include <algorithm>
#include <stdexcept>
#include <string_view>

#include "settings/settings.hpp"
#include "postgres/pg_boundary.hpp"
#include "postgres/spi_transaction.hpp"

namespace billguard {

namespace {

void Log(const std::string& message) {
  CallPostgres([&] { ereport(LOG, (errmsg("billguard dispatcher: %s", message.c_str()))); });
}

}  // namespace

std::string ChargeCurrency(const std::string& form_body) {
  // The body billguard.charge_request_body froze: `currency=` once, a
  // lower-case code that needs no escape.
  std::size_t at = 0;
  while (at < form_body.size()) {
    const std::size_t end = std::min(form_body.find('&', at), form_body.size());
    const std::string_view pair(form_body.data() + at, end - at);
    if (pair.substr(0, 9) == "currency=") return std::string(pair.substr(9));
    at = end + 1;
  }
  return "usd";
}

std::optional<VaultCredential> LookupVaultCredential(const std::string& api_base,
                                                     const std::string& billing_period,
                                                     const std::string& currency) {
  const auto rows = ExecuteInTransaction(
      "SELECT key_id, vault_key, cap_cents, billguard.minor_units_text(cap_cents, currency) "
      "FROM billguard.vault_credentials "
      "WHERE api_base = $1 AND billing_period = $2 AND currency = $3",
      {api_base, billing_period, currency});
  if (rows.empty() || !rows[0][0] || !rows[0][1] || !rows[0][2]) return std::nullopt;
  return VaultCredential{*rows[0][0], *rows[0][1], std::stoll(*rows[0][2]),
                         rows[0][3].value_or(*rows[0][2] + " " + currency)};
}

VaultKeyAsk VaultKeyRequestBody(const std::string& billing_period, const std::string& currency,
                                const std::string& endpoint, double headroom,
                                std::optional<long long> cap_cents) {
  // The headroom is a ratio, not money: six decimals of it are plenty, and
  // the cap is then computed in numeric.
  const std::string ratio = std::to_string(headroom);  // "%f": six decimals
  const auto rows = ExecuteInTransaction(
      "SELECT body::text, cap_cents, billguard.minor_units_text(cap_cents, $5) "
      "FROM billguard.vault_key_request($1, $2, $3::numeric, $4::bigint, $5)",
      {billing_period, endpoint, ratio,
       cap_cents ? SqlValue(std::to_string(*cap_cents)) : std::nullopt, currency});
  if (rows.empty() || !rows[0][0] || !rows[0][1] || !rows[0][2]) {
    throw std::runtime_error("billguard.vault_key_request returned no body");
  }
  return VaultKeyAsk{*rows[0][0], std::stoll(*rows[0][1]), *rows[0][2]};
}

void StoreVaultCredential(const std::string& api_base, const std::string& billing_period,
                          const std::string& currency, const VaultCredential& credential) {
  ExecuteInTransaction("SELECT billguard.store_vault_credential($1, $2, $3, $4, $5, $6::bigint)",
                       {api_base, billing_period, currency, credential.key_id, credential.vault_key,
                        std::to_string(credential.cap_cents)});
}

void ForgetVaultCredential(const std::string& api_base, const std::string& billing_period,
                           const std::string& currency, const std::string& key_id) {
  ExecuteInTransaction("SELECT billguard.forget_vault_credential($1, $2, $3, $4)",
                       {api_base, billing_period, currency, key_id});
}

std::string VaultKeys::Load() {
  // Through the proxy, each period's vault key is obtained with the
  // issuer token; otherwise the one key of api_key_file bills everything.
  through_proxy_ = settings::vault_issuer_token_file[0] != '\0';
  keys_.clear();
  asking_.clear();
  rekeying_for_accounts_.clear();
  keys_for_accounts_.clear();
  asking_by_budget_.clear();
  if (through_proxy_) {
    const IssuerTokenResult loaded = LoadIssuerToken(settings::vault_issuer_token_file);
    issuer_token_ = loaded.token;
    direct_key_ = {};
    return loaded.error;
  }
  const ApiKeyResult loaded = LoadApiKey(settings::api_key_file);
  direct_key_ = VaultCredential{"", loaded.key, 0};
  issuer_token_.clear();
  return loaded.error;
}

const VaultCredential* VaultKeys::KeyFor(const std::string& period, const std::string& currency,
                                         HttpClient& http) {
  if (!through_proxy_) return &direct_key_;
  const std::string budget = Budget(period, currency);
  auto found = keys_.find(budget);
  if (found != keys_.end()) return &found->second;
  if (AskingFor(period, currency)) return nullptr;
  std::optional<VaultCredential> kept = LookupVaultCredential(settings::api_base, period, currency);
  if (kept) return &keys_.emplace(budget, std::move(*kept)).first->second;
  // The cap is the period's claimed total in the currency times
  // vault_cap_headroom, computed in SQL.
  Ask(PendingAsk{period, currency,
                 VaultKeyRequestBody(period, currency, settings::stripe_endpoint,
                                     settings::vault_cap_headroom, {}),
                 false},
      http);
  return nullptr;
}

void VaultKeys::Ask(PendingAsk asking, HttpClient& http) {
  const std::uint64_t tag = kKeyTag | next_tag_++;
  HttpRequest request =
      VaultKeyRequest(settings::api_base, issuer_token_, asking.ask.json_body, user_agent_);
  request.tag = tag;
  asking_by_budget_[Budget(asking.period, asking.currency)] = tag;
  asking_.emplace(tag, std::move(asking));
  http.Submit(std::move(request));
  http.Start();
}

// A key lost (a restored database, a crash before it was stored) is simply
// issued again: the proxy joins it to the period's budget. When the budget
// exists with another cap (more records claimed since the first key), the
// proxy answers 409 with that cap, and the key is asked for again at it:
// billing goes on, and what the cap has no room for is blocked.
VaultKeyAnswer VaultKeys::TakeAnswer(const HttpResponse& response, HttpClient& http) {
  auto found = asking_.find(response.tag);
  if (found == asking_.end()) return {};  // asked for before a reload
  PendingAsk asking = std::move(found->second);
  asking_.erase(found);
  asking_by_budget_.erase(Budget(asking.period, asking.currency));
  const IssuedVaultKey issued = ReadIssuedVaultKey(response);
  if (issued.existing_cap_cents && !asking.at_existing_cap) {
    const std::string asked = asking.ask.cap_text;
    asking.ask = VaultKeyRequestBody(asking.period, asking.currency, settings::stripe_endpoint,
                                     settings::vault_cap_headroom, issued.existing_cap_cents);
    Log("the proxy already has a budget for " + asking.period + " with a cap of " +
        asking.ask.cap_text + ", not the " + asked +
        " asked (records were claimed after its first key was issued): billing joins it " +
        "at its cap, and charges past it are blocked until an admin raises the cap");
    asking.at_existing_cap = true;
    Ask(std::move(asking), http);
    return {};
  }
  if (issued.vault_key.empty()) {
    const std::string why = "the proxy issued no vault key for " + asking.period +
                            (asking.currency == "usd" ? "" : " in " + asking.currency) + " (HTTP " +
                            std::to_string(issued.http_status) + ": " + issued.message + ")";
    // A refused token or request (api_base not a proxy, say) waits for a
    // person; an unreachable or failing proxy is tried again.
    const bool refused = issued.http_status >= 400 && issued.http_status < 500;
    return {refused ? VaultKeyAnswer::Next::kPause : VaultKeyAnswer::Next::kHoldOff, why};
  }
  VaultCredential credential{issued.key_id, issued.vault_key, asking.ask.cap_cents,
                             asking.ask.cap_text};
  StoreVaultCredential(settings::api_base, asking.period, asking.currency, credential);
  Log("obtained vault key " + credential.key_id + " for " + asking.period + ", cap " +
      credential.cap_text);
  if (rekeying_for_accounts_.erase(Budget(asking.period, asking.currency)) != 0) {
    keys_for_accounts_.insert(credential.key_id);
  }
  keys_[Budget(asking.period, asking.currency)] = std::move(credential);
  return {};
}

bool VaultKeys::ForgetForAccount(const std::string& period, const std::string& currency,
                                 const std::string& key_id) {
  if (keys_for_accounts_.count(key_id) != 0) return false;
  const std::string budget = Budget(period, currency);
  const auto found = keys_.find(budget);
  if (found == keys_.end() || found->second.key_id != key_id) return true;  // replaced already
  Log("the proxy refused a connected account to the vault key " + key_id + " of " + period +
      (currency == "usd" ? "" : " in " + currency) +
      " (a record of it claimed after the key was obtained); obtaining a new one naming it");
  ForgetVaultCredential(settings::api_base, period, currency, key_id);
  keys_.erase(found);
  rekeying_for_accounts_.insert(budget);
  return true;
}

void VaultKeys::ForgetExpired(const std::string& period, const std::string& currency,
                              const std::string& key_id) {
  const auto found = keys_.find(Budget(period, currency));
  if (found == keys_.end() || found->second.key_id != key_id) return;
  Log("the vault key " + key_id + " of " + period + (currency == "usd" ? "" : " in " + currency) +
      " expired; obtaining a new one");
  ForgetVaultCredential(settings::api_base, period, currency, key_id);
  keys_.erase(found);
}

std::string VaultKeys::DescribeCap(const std::string& period, const std::string& currency) const {
  std::string cap = "the period's vault cap";
  const auto found = keys_.find(Budget(period, currency));
  if (found != keys_.end()) {
    cap += " is " + found->second.cap_text + " (vault key " + found->second.key_id + ")";
  } else if (currency != "usd") {
    cap += " in " + currency;
  }
  return cap;
}

}  // namespace billguard
