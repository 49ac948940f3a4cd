// Random base62 text (see random_text.hpp).
#include "cpp_only.hpp"

#include "random_text.hpp"

#include <stdexcept>

namespace billguard {

std::string RandomBase62(std::size_t length, const RandomBytes& random_bytes) {
  static constexpr char kAlphabet[] =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  static constexpr unsigned kUnbiasedLimit = 248;  // 4 * 62
  std::string text;
  text.reserve(length);
  unsigned char batch[64];
  while (text.size() < length) {
    if (!random_bytes(batch, sizeof(batch))) throw std::runtime_error("no random bytes available");
    for (unsigned char byte : batch) {
      if (byte >= kUnbiasedLimit) continue;
      text.push_back(kAlphabet[byte % 62]);
      if (text.size() == length) break;
    }
  }
  return text;
}

}  // namespace billguard
