// SHA-256 (see sha256.hpp).
#include "cpp_only.hpp"

#include "sha256.hpp"

#include <openssl/evp.h>

#include <stdexcept>

namespace billguard {

namespace {

// OpenSSL 3's one-shot digests fetch the algorithm on every call, which
// costs more than hashing 40 bytes. Fetch once per thread and reuse.
class Sha256 {
 public:
  Sha256() : md_(EVP_MD_fetch(nullptr, "SHA256", nullptr)), ctx_(EVP_MD_CTX_new()) {
    if (md_ == nullptr || ctx_ == nullptr) throw std::runtime_error("OpenSSL SHA-256 unavailable");
  }
  ~Sha256() {
    EVP_MD_CTX_free(ctx_);
    EVP_MD_free(md_);
  }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Digest(std::string_view data, unsigned char* out) {
    unsigned int out_length = 0;
    if (EVP_DigestInit_ex2(ctx_, md_, nullptr) != 1 ||
        EVP_DigestUpdate(ctx_, data.data(), data.size()) != 1 ||
        EVP_DigestFinal_ex(ctx_, out, &out_length) != 1) {
      throw std::runtime_error("OpenSSL SHA-256 failed");
    }
  }

 private:
  EVP_MD* md_;
  EVP_MD_CTX* ctx_;
};

}  // namespace

void Sha256Into(std::string_view data, unsigned char* out) {
  thread_local Sha256 sha256;
  sha256.Digest(data, out);
}

std::string Sha256Bytes(std::string_view data) {
  unsigned char digest[kSha256Bytes];
  Sha256Into(data, digest);
  return std::string(reinterpret_cast<const char*>(digest), kSha256Bytes);
}

std::string Sha256Hex(std::string_view data) {
  return LowerHex(Sha256Bytes(data));
}

std::string LowerHex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * bytes.size());
  for (const char byte : bytes) {
    const auto c = static_cast<unsigned char>(byte);
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 0x0f]);
  }
  return hex;
}

}  // namespace billguard
