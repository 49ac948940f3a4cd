// Random base62 text for secrets and public ids. Pure C++: the caller
// supplies the random bytes (PostgreSQL's pg_strong_random in the extension),
// so the mapping can be tested on its own.
#pragma once

#include "cpp_only.hpp"

#include <cstddef>
#include <functional>
#include <string>

namespace billguard {

// Fills `size` bytes at `bytes` from a cryptographic source; false on failure.
using RandomBytes = std::function<bool(unsigned char* bytes, std::size_t size)>;

// `length` characters of [0-9A-Za-z], each uniformly distributed: bytes of
// 248 and above are discarded, since 248 is the largest multiple of 62 that
// fits in a byte and keeping them would favour the first eight characters.
// Throws std::runtime_error when the source fails.
std::string RandomBase62(std::size_t length, const RandomBytes& random_bytes);

}  // namespace billguard
