// The secrets named by command-line flags (see secret_flags.hpp).
#include "secret_flags.hpp"

#include "secret_file.hpp"

namespace billguard::proxy {

std::string ReadSecretFlag(const std::string& flag, const std::string& path) {
  billguard::SecretFile file = billguard::ReadSecretFile(path, flag + " " + path);
  if (!file.error.empty()) throw StartupError(file.error);
  if (file.content.empty()) throw StartupError(flag + " " + path + " is empty");
  return file.content;
}

std::string ReadTokenFile(const std::string& flag, const std::string& path) {
  std::string token = ReadSecretFlag(flag, path);
  if (token.size() < 24) throw StartupError(flag + " " + path + " holds fewer than 24 characters");
  return token;
}

}  // namespace billguard::proxy
