// Stripe-shaped error bodies (see stripe_errors.hpp).
#include "stripe_errors.hpp"

#include <nlohmann/json.hpp>

namespace billguard::proxy {

std::string StripeErrorBody(const std::string& type, const std::string& code,
                            const std::string& message) {
  nlohmann::json error = {{"type", type}, {"message", message}};
  if (!code.empty()) error["code"] = code;
  // Invalid UTF-8 in an echoed value is replaced, never a reason to fail.
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false,
                                               nlohmann::json::error_handler_t::replace);
}

}  // namespace billguard::proxy
