// Reading the API key file (see api_key.hpp).
#include "cpp_only.hpp"

#include "api_key.hpp"
#include "secret_file.hpp"

namespace billguard {

bool IsStripeKey(const std::string& key) {
  if (key.size() < 8 || key.size() > 255) return false;
  const std::string prefix = key.substr(0, 3);
  if (prefix != "rk_" && prefix != "sk_" && prefix != "vk_") return false;
  for (char c : key) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

ApiKeyResult LoadApiKey(const std::string& path) {
  if (path.empty()) return {"", "billguard.api_key_file is not set"};
  // Named by its setting: the path is for superusers only.
  SecretFile file = ReadSecretFile(path, "billguard.api_key_file");
  if (!file.error.empty()) return {"", file.error};
  if (!IsStripeKey(file.content))
    return {"", "billguard.api_key_file does not hold a Stripe key (rk_..., sk_... or vk_...)"};
  return {file.content, ""};
}

}  // namespace billguard
