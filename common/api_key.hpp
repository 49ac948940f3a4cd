// Loading the Stripe key from billguard.api_key_file. Pure C++. The key is
// a secret: it is never logged, and no error message contains it.
#pragma once

#include "cpp_only.hpp"

#include <string>

namespace billguard {

struct ApiKeyResult {
  std::string key;    // empty when unusable
  std::string error;  // why, without the key's contents
};

// Accepts a restricted key (rk_...), a secret key (sk_...) or a proxy vault
// key (vk_...), surrounded by optional whitespace.
ApiKeyResult LoadApiKey(const std::string& path);

}  // namespace billguard
