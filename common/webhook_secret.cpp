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

WebhookSecretResult LoadWebhookSecrets(const std::string& path) {
  if (path.empty()) return {{}, "billguard.webhook_secret_file is not set"};
  SecretFile file = ReadSecretFile(path, "billguard.webhook_secret_file");
  if (!file.error.empty()) return {{}, file.error};
  std::vector<std::string> secrets;
  static const char* const kSpace = " \t\r\n\f\v";
  for (std::size_t start = file.content.find_first_not_of(kSpace); start != std::string::npos;) {
    const std::size_t end = file.content.find_first_of(kSpace, start);
    secrets.push_back(file.content.substr(start, end - start));
    start = end == std::string::npos ? end : file.content.find_first_not_of(kSpace, end);
  }
  if (secrets.empty()) {
    return {{}, "billguard.webhook_secret_file does not hold a webhook signing secret (whsec_...)"};
  }
  for (std::size_t i = 0; i < secrets.size(); ++i) {
    if (!IsSigningSecret(secrets[i])) {
      return {
          {},
          secrets.size() == 1
              ? "billguard.webhook_secret_file does not hold a webhook signing secret (whsec_...)"
              : "secret " + std::to_string(i + 1) +
                    " of billguard.webhook_secret_file is not a webhook signing secret "
                    "(whsec_...)"};
    }
  }
  if (secrets.size() > kMaxWebhookSecrets) {
    return {{},
            "billguard.webhook_secret_file holds " + std::to_string(secrets.size()) +
                " secrets, more than " + std::to_string(kMaxWebhookSecrets)};
  }
  return {secrets, ""};
}

}  // namespace billguard
