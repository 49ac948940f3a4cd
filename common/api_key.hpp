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

// Accepts a restricted key (rk_...), a secret key (sk_...) or a proxy vault
// key (vk_...), surrounded by optional whitespace, from a regular file that
// the server's user owns and no one else may read or write (mode 0600 or
// 0400), as libpq requires of ~/.pgpass. A symbolic link is followed and the
// file it leads to is checked, as secret stores deliver keys through links.
ApiKeyResult LoadApiKey(const std::string& path);

}  // namespace billguard
