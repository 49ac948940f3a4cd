// Credentials (see credentials.hpp).
#include "credentials.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <vector>

#include "sha256.hpp"
#include "vault_key_request.hpp"

namespace billguard::proxy {

namespace {

std::optional<std::string> DecodeBase64(const std::string& text) {
  if (text.empty() || text.size() % 4 != 0 || text.size() > 1024) return std::nullopt;
  std::vector<unsigned char> out(text.size() / 4 * 3);
  const int length =
      EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()),
                      static_cast<int>(text.size()));
  if (length < 0) return std::nullopt;
  // EVP_DecodeBlock counts the bytes of the padding too.
  std::size_t padding = 0;
  for (auto c = text.rbegin(); c != text.rend() && *c == '='; ++c) ++padding;
  return std::string(reinterpret_cast<char*>(out.data()),
                     static_cast<std::size_t>(length) - padding);
}

}  // namespace

std::optional<std::string> PresentedCredential(const std::string& authorization) {
  if (authorization.rfind("Bearer ", 0) == 0) {
    std::string credential = authorization.substr(7);
    if (credential.empty() || credential.find_first_of(" \t") != std::string::npos)
      return std::nullopt;
    return credential;
  }
  if (authorization.rfind("Basic ", 0) == 0) {
    const auto decoded = DecodeBase64(authorization.substr(6));
    if (!decoded) return std::nullopt;
    const std::string user = decoded->substr(0, decoded->find(':'));
    if (user.empty()) return std::nullopt;
    return user;
  }
  return std::nullopt;
}

bool LooksLikeVaultKey(const std::string& credential) {
  return IsVaultKey(credential);
}

bool TokenMatches(const std::string& presented, const std::string& expected) {
  // Equal-length digests, so neither the length nor a prefix shows in the time taken.
  const std::string a = Sha256Bytes(presented);
  const std::string b = Sha256Bytes(expected);
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace billguard::proxy
