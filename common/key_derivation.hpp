// Content-hash idempotency keys. Pure C++ (no PostgreSQL headers): the
// extension, the proxy and the unit tests compile this same file.
//
// A key is the first 32 lower-case hex characters of
// SHA-256("<customer_id>:<billing_period>:<namespace>"), byte-compatible with
// the seed's DigestUtils.sha256Hex(s"$customerId:$billingPeriod:akka-billing").take(32).
// It is built from stable business fields only: never time, randomness,
// process identity or a request envelope.
#pragma once

#include "cpp_only.hpp"

#include <cstddef>
#include <string_view>

namespace billguard {

constexpr std::size_t kIdempotencyKeyLength = 32;
constexpr std::size_t kMaxCustomerIdBytes = 255;
constexpr std::size_t kMaxNamespaceBytes = 255;

// True for "YYYY-MM" with a year 1970..9999 and a month 01..12.
bool IsValidBillingPeriod(std::string_view billing_period);

// Throws InvalidParameter naming the argument when an input would make the
// key ambiguous or meaningless (empty customer id, bad period, empty
// namespace or one containing ':').
void ValidateKeyInputs(std::string_view customer_id, std::string_view billing_period,
                       std::string_view key_namespace);

// Writes exactly kIdempotencyKeyLength characters to `out` (not terminated).
void DeriveIdempotencyKey(std::string_view customer_id, std::string_view billing_period,
                          std::string_view key_namespace, char* out);

}  // namespace billguard
