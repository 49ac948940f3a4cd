// Content-hash idempotency keys (see key_derivation.hpp).
#include "cpp_only.hpp"

#include "key_derivation.hpp"

#include <cstring>
#include <string>

#include "errors.hpp"
#include "sha256.hpp"

namespace billguard {

namespace {

bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}

}  // namespace

bool IsValidBillingPeriod(std::string_view p) {
  if (p.size() != 7 || p[4] != '-') return false;
  for (int i : {0, 1, 2, 3, 5, 6}) {
    if (!IsDigit(p[i])) return false;
  }
  const int year = (p[0] - '0') * 1000 + (p[1] - '0') * 100 + (p[2] - '0') * 10 + (p[3] - '0');
  const int month = (p[5] - '0') * 10 + (p[6] - '0');
  return year >= 1970 && month >= 1 && month <= 12;
}

void ValidateKeyInputs(std::string_view customer_id, std::string_view billing_period,
                       std::string_view key_namespace) {
  if (customer_id.empty()) throw InvalidParameter("customer_id must not be empty");
  if (customer_id.size() > kMaxCustomerIdBytes) {
    throw InvalidParameter("customer_id must be at most " + std::to_string(kMaxCustomerIdBytes) +
                           " bytes, got " + std::to_string(customer_id.size()));
  }
  if (!IsValidBillingPeriod(billing_period)) {
    throw InvalidParameter("billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)");
  }
  if (key_namespace.empty()) throw InvalidParameter("namespace must not be empty");
  if (key_namespace.size() > kMaxNamespaceBytes) {
    throw InvalidParameter("namespace must be at most " + std::to_string(kMaxNamespaceBytes) +
                           " bytes");
  }
  // ':' separates the fields; in the namespace it would let two different
  // (period, namespace) pairs hash the same text.
  if (key_namespace.find(':') != std::string_view::npos) {
    throw InvalidParameter("namespace must not contain ':'");
  }
}

void DeriveIdempotencyKey(std::string_view customer_id, std::string_view billing_period,
                          std::string_view key_namespace, char* out) {
  ValidateKeyInputs(customer_id, billing_period, key_namespace);

  // Bounded by the validation above, so the message fits on the stack.
  char message[kMaxCustomerIdBytes + 1 + 7 + 1 + kMaxNamespaceBytes];
  std::size_t length = 0;
  auto append = [&](std::string_view part) {
    std::memcpy(message + length, part.data(), part.size());
    length += part.size();
  };
  append(customer_id);
  append(":");
  append(billing_period);
  append(":");
  append(key_namespace);

  unsigned char digest[kSha256Bytes];
  Sha256Into(std::string_view(message, length), digest);

  // Written in place: this runs once per row of bill_period.
  static constexpr char kHex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < kIdempotencyKeyLength / 2; ++i) {
    out[2 * i] = kHex[digest[i] >> 4];
    out[2 * i + 1] = kHex[digest[i] & 0x0f];
  }
}

}  // namespace billguard
