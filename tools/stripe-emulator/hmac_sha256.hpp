// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), to sign webhook
// deliveries as Stripe does. Written out here rather than taken from a
// library billguard also uses: the emulator checks billguard's signature
// verification, and the two must not share a mistake.
#pragma once

#include <string>
#include <string_view>

namespace stripe_emulator {

// Lower-case hex of HMAC-SHA256(key, message).
std::string hmac_sha256_hex(std::string_view key, std::string_view message);

}  // namespace stripe_emulator
