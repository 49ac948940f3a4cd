// Loading the webhook endpoint's signing secret from
// billguard.webhook_secret_file. Pure C++. The secret never appears in an
// error message, nor does the file's path (which only superusers may see).
#pragma once

#include "cpp_only.hpp"

#include <string>

namespace billguard {

struct WebhookSecretResult {
  std::string secret;  // empty when unusable
  std::string error;   // why, without the secret or the path
};

// Accepts a Stripe signing secret (whsec_ and 8 to 249 letters, digits or
// '+', '/', '=', '_', '-'), surrounded by optional white space, from a
// secret file (see secret_file.hpp: owned by the server's user, mode 0600 or
// 0400).
WebhookSecretResult LoadWebhookSecret(const std::string& path);

}  // namespace billguard
