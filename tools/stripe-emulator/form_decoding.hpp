// Decoding of application/x-www-form-urlencoded request bodies and URL query
// strings, which is how Stripe clients send every parameter.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stripe_emulator {

// Parameters in the order they were sent; names may repeat (metadata, lists),
// so this is a sequence rather than a map.
using FormParams = std::vector<std::pair<std::string, std::string>>;

// Decodes %XX escapes and '+' as space; nullopt when an escape is malformed.
std::optional<std::string> percent_decode(std::string_view encoded);

// Splits on '&' and the first '=' of each pair; empty segments are skipped and
// a pair without '=' has an empty value. nullopt on a malformed escape.
std::optional<FormParams> decode_form(std::string_view encoded);

}  // namespace stripe_emulator
