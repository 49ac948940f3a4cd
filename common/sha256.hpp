// SHA-256 and lower-case hex, for the idempotency keys, the proxy's request
// digests and token comparisons. Pure C++ over OpenSSL.
#pragma once

#include "cpp_only.hpp"

#include <cstddef>
#include <string>
#include <string_view>

namespace billguard {

constexpr std::size_t kSha256Bytes = 32;

// Writes the kSha256Bytes of SHA-256(data) to `out`.
void Sha256Into(std::string_view data, unsigned char* out);

// SHA-256(data) as kSha256Bytes raw bytes.
std::string Sha256Bytes(std::string_view data);

// SHA-256(data) as 64 lower-case hex characters.
std::string Sha256Hex(std::string_view data);

// `bytes` as lower-case hex, two characters a byte.
std::string LowerHex(std::string_view bytes);

}  // namespace billguard
