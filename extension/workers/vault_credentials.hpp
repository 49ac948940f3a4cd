// The dispatcher's side of billguard.vault_credentials
// (sql/install/83_vault_credentials.sql): each call is one short
// transaction; none is open while the proxy is asked for a key.
#pragma once

#include <optional>
#include <string>

namespace billguard {

// A period's vault key, as kept for the proxy at api_base.
struct VaultCredential {
  std::string key_id;
  std::string vault_key;  // the secret: never logged
  long long cap_cents = 0;
};

std::optional<VaultCredential> LookupVaultCredential(const std::string& api_base,
                                                     const std::string& billing_period,
                                                     const std::string& currency);

// The POST /keys body for the period (billguard.vault_key_request), and the
// cap it asks in cents: the period's total times headroom, or cap_cents
// when given (to join a budget that has it).
struct VaultKeyAsk {
  std::string json_body;
  long long cap_cents = 0;
};
VaultKeyAsk VaultKeyRequestBody(const std::string& billing_period, const std::string& endpoint,
                                double headroom, std::optional<long long> cap_cents);

void StoreVaultCredential(const std::string& api_base, const std::string& billing_period,
                          const std::string& currency, const VaultCredential& credential);
void ForgetVaultCredential(const std::string& api_base, const std::string& billing_period,
                           const std::string& currency, const std::string& key_id);

}  // namespace billguard
