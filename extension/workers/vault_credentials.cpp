// Typed calls of the vault-credential SQL (see vault_credentials.hpp).
#include "workers/vault_credentials.hpp"

#include <stdexcept>

#include "postgres/spi_transaction.hpp"

namespace billguard {

std::optional<VaultCredential> LookupVaultCredential(const std::string& api_base,
                                                     const std::string& billing_period,
                                                     const std::string& currency) {
  const auto rows = ExecuteInTransaction(
      "SELECT key_id, vault_key, cap_cents FROM billguard.vault_credentials "
      "WHERE api_base = $1 AND billing_period = $2 AND currency = $3",
      {api_base, billing_period, currency});
  if (rows.empty() || !rows[0][0] || !rows[0][1] || !rows[0][2]) return std::nullopt;
  return VaultCredential{*rows[0][0], *rows[0][1], std::stoll(*rows[0][2])};
}

VaultKeyAsk VaultKeyRequestBody(const std::string& billing_period, const std::string& endpoint,
                                double headroom, std::optional<long long> cap_cents) {
  // The headroom is a ratio, not money: six decimals of it are plenty, and
  // the cap is then computed in numeric.
  const std::string ratio = std::to_string(headroom);  // "%f": six decimals
  const auto rows = ExecuteInTransaction(
      "SELECT body::text, cap_cents FROM billguard.vault_key_request($1, $2, $3::numeric, "
      "$4::bigint)",
      {billing_period, endpoint, ratio,
       cap_cents ? SqlValue(std::to_string(*cap_cents)) : std::nullopt});
  if (rows.empty() || !rows[0][0] || !rows[0][1]) {
    throw std::runtime_error("billguard.vault_key_request returned no body");
  }
  return VaultKeyAsk{*rows[0][0], std::stoll(*rows[0][1])};
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

}  // namespace billguard
