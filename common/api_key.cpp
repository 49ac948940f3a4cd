// Reading the API key file (see api_key.hpp).
#include "cpp_only.hpp"

#include "api_key.hpp"

#include <fstream>
#include <sstream>

namespace billguard {

namespace {

bool LooksLikeStripeKey(const std::string& key) {
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

}  // namespace

ApiKeyResult LoadApiKey(const std::string& path) {
  if (path.empty()) return {"", "billguard.api_key_file is not set"};
  std::ifstream file(path);
  if (!file) return {"", "cannot read billguard.api_key_file \"" + path + "\""};
  std::stringstream content;
  content << file.rdbuf();
  std::string key = content.str();
  const auto first = key.find_first_not_of(" \t\r\n");
  const auto last = key.find_last_not_of(" \t\r\n");
  key = first == std::string::npos ? "" : key.substr(first, last - first + 1);
  if (!LooksLikeStripeKey(key)) {
    return {"", "billguard.api_key_file \"" + path +
                    "\" does not hold a Stripe key (rk_..., sk_... or vk_...)"};
  }
  return {key, ""};
}

}  // namespace billguard
