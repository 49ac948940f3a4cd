// Loading the Stripe key from billguard.api_key_file. Pure C++. The key is
// a secret: it is never logged, and no error message contains it, nor the
// file's path (which only superusers may see).
#pragma once

#include "cpp_only.hpp"

#include <string>

namespace billguard {

struct ApiKeyResult {
  std::string key;    // empty when unusable
  std::string error;  // why, without the key's contents
};

// The shape of a Stripe key: rk_, sk_ (or a proxy vault key, vk_) and
// letters, digits and '_', 8 to 255 characters.
bool IsStripeKey(const std::string& key);

// Accepts a restricted key (rk_...), a secret key (sk_...) or a proxy vault
// key (vk_...), surrounded by optional whitespace, from a secret file (see
// secret_file.hpp: owned by the server's user, mode 0600 or 0400).
ApiKeyResult LoadApiKey(const std::string& path);

}  // namespace billguard
