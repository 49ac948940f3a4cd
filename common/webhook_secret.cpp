// Reading the webhook secret file (see webhook_secret.hpp).
#include "cpp_only.hpp"

#include "webhook_secret.hpp"
#include "secret_file.hpp"

namespace billguard {

namespace {

bool IsSigningSecret(const std::string& secret) {
  if (secret.size() < 14 || secret.size() > 255 || secret.compare(0, 6, "whsec_") != 0)
    return false;
  for (char c : secret) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '+' || c == '/' || c == '=' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

WebhookSecretResult LoadWebhookSecret(const std::string& path) {
  if (path.empty()) return {"", "billguard.webhook_secret_file is not set"};
  SecretFile file = ReadSecretFile(path, "billguard.webhook_secret_file");
  if (!file.error.empty()) return {"", file.error};
  if (!IsSigningSecret(file.content)) {
    return {"", "billguard.webhook_secret_file does not hold a webhook signing secret (whsec_...)"};
  }
  return {file.content, ""};
}

}  // namespace billguard
