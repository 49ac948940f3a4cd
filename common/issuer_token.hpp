// Loading billguard-proxy's issuer token from
// billguard.vault_issuer_token_file. Pure C++. The token never appears in
// an error message, nor does the file's path (which only superusers may
// see).
#pragma once

#include "cpp_only.hpp"

#include <string>

namespace billguard {

struct IssuerTokenResult {
  std::string token;  // empty when unusable
  std::string error;  // why, without the token or the path
};

// Accepts 24 to 1024 printable ASCII characters without spaces (the proxy
// refuses shorter tokens), surrounded by optional white space, from a
// secret file (see secret_file.hpp: owned by the server's user, mode 0600
// or 0400).
IssuerTokenResult LoadIssuerToken(const std::string& path);

}  // namespace billguard
