// UTF-8 decoding, one code point at a time: what the customer-id rule and
// the proxy's storable answers call valid UTF-8.
#pragma once

#include "cpp_only.hpp"

#include <cstddef>
#include <optional>
#include <string_view>

namespace billguard {

// Decodes the UTF-8 sequence at text[*position] and advances *position past
// it; nothing (and *position unchanged) for a malformed, truncated, overlong
// or surrogate sequence, or one past U+10FFFF.
std::optional<char32_t> NextCodePoint(std::string_view text, std::size_t* position);

}  // namespace billguard
