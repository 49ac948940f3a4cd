// Reading the proxy's secrets (the Stripe key, the tokens) from files that
// only their owner may read, as libpq requires of .pgpass.
#pragma once

#include <stdexcept>
#include <string>

namespace billguard::proxy {

// Why the proxy cannot start, as one line naming the flag and file; never
// the secret itself.
class StartupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The file's content without surrounding white space. Throws StartupError
// when common/secret_file.hpp refuses the file, or when it is empty.
std::string ReadSecretFlag(const std::string& flag, const std::string& path);

// A token file: as ReadSecretFlag, at least 24 characters.
std::string ReadTokenFile(const std::string& flag, const std::string& path);

}  // namespace billguard::proxy
