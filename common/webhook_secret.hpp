// Loading the webhook endpoints' signing secrets from
// billguard.webhook_secret_file. Pure C++. A secret never appears in an
// error message, nor does the file's path (which only superusers may see).
#pragma once

#include "cpp_only.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace billguard {

struct WebhookSecretResult {
  std::vector<std::string> secrets;  // empty when unusable
  std::string error;                 // why, without a secret or the path
};

// How many endpoints one database may hear: each Stripe endpoint has its
// own secret (a platform's account endpoint and its Connect endpoint).
constexpr std::size_t kMaxWebhookSecrets = 8;

// Accepts 1 to kMaxWebhookSecrets Stripe signing secrets (whsec_ and 8 to
// 249 letters, digits or '+', '/', '=', '_', '-'), separated and surrounded
// by white space (one a line), from a secret file (see secret_file.hpp:
// owned by the server's user, mode 0600 or 0400).
WebhookSecretResult LoadWebhookSecrets(const std::string& path);

}  // namespace billguard
