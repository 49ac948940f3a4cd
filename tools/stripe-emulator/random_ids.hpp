// Stripe-looking identifiers: a type prefix plus random alphanumerics.
// Clients may rely on the prefix (pi_, ch_, req_), never on the rest.
#pragma once

#include <string>
#include <string_view>

namespace stripe_emulator {

std::string random_alphanumeric(std::size_t length);

// prefix "pi" gives "pi_" followed by 24 random alphanumerics.
std::string new_object_id(std::string_view prefix);

std::string new_request_id();

}  // namespace stripe_emulator
