// Asking billguard-proxy for a billing period's vault key (POST /keys) and
// reading its answer. Pure C++: the dispatcher builds the body in SQL (the
// cap is numeric there, never floating point) and sends it with no
// transaction open.
#pragma once

#include "cpp_only.hpp"

#include <optional>
#include <string>

#include "http_client.hpp"

namespace billguard {

// POST <api_base>/keys with the issuer token and the JSON body.
HttpRequest VaultKeyRequest(const std::string& api_base, const std::string& issuer_token,
                            const std::string& json_body, const std::string& user_agent);

// What the proxy answered. The secret is kept in vault_key only, never in
// message.
struct IssuedVaultKey {
  long http_status = 0;
  std::string vault_key;  // set only on a usable 200
  std::string key_id;
  // A 409 budget_cap_differs: the period's budget exists with this cap
  // (cents), which a key request must name to join it.
  std::optional<long long> existing_cap_cents;
  std::string message;  // why there is no key: printable, bounded
};

IssuedVaultKey ReadIssuedVaultKey(const HttpResponse& response);

// A vault key secret: vk_live_ or vk_test_ and 32 letters or digits.
bool IsVaultKey(const std::string& text);

// The error code of the proxy's 409 when the period's budget has another cap.
inline constexpr const char* kBudgetCapDiffers = "budget_cap_differs";

}  // namespace billguard
