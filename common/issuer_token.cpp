// Reading the issuer token file (see issuer_token.hpp).
#include "cpp_only.hpp"

#include "issuer_token.hpp"
#include "secret_file.hpp"

namespace billguard {

namespace {

bool IsToken(const std::string& token) {
  if (token.size() < 24 || token.size() > 1024) return false;
  for (char c : token) {
    if (c <= 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

IssuerTokenResult LoadIssuerToken(const std::string& path) {
  if (path.empty()) return {"", "billguard.vault_issuer_token_file is not set"};
  SecretFile file = ReadSecretFile(path, "billguard.vault_issuer_token_file");
  if (!file.error.empty()) return {"", file.error};
  if (!IsToken(file.content)) {
    return {"",
            "billguard.vault_issuer_token_file does not hold an issuer token (24 to 1024 "
            "printable characters, no spaces)"};
  }
  return {file.content, ""};
}

}  // namespace billguard
