// Reading a secret (an API key, a token) from a file that only its owner may
// read, as libpq requires of ~/.pgpass. Pure C++, shared by the dispatcher's
// key file and the proxy's key and token files.
#pragma once

#include "cpp_only.hpp"

#include <string>

namespace billguard {

struct SecretFile {
  std::string content;  // without surrounding white space; empty when refused
  std::string error;    // why it was refused, naming the file as `name`; never its content
};

// The file must be a regular file (a symbolic link is followed and the file
// it leads to is checked, as secret stores deliver secrets through links),
// owned by this process's user, with no group or world access (mode 0600 or
// 0400), and at most 4 KiB. `name` is how errors name the file (a setting,
// or a flag with its path).
SecretFile ReadSecretFile(const std::string& path, const std::string& name);

}  // namespace billguard
