// Verifying Stripe-Signature headers (see stripe_signature.hpp).
#include "cpp_only.hpp"

#include "stripe_signature.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <string>
#include <vector>

#include "errors.hpp"

namespace billguard {

namespace {

// Stripe's header is a few hundred bytes; anything far larger is not one.
constexpr std::size_t kMaxHeaderBytes = 8192;
constexpr std::size_t kSignatureHexLength = 64;

struct SignatureHeader {
  std::int64_t timestamp = 0;
  std::vector<std::string_view> v1;
};

std::string_view Trimmed(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  return text;
}

[[noreturn]] void Malformed(const std::string& why) {
  throw InvalidParameter("the Stripe-Signature header is malformed: " + why);
}

// "t=1700000000,v1=ab12...,v1=cd34...,v0=..." in any order; schemes other
// than v1 (Stripe's test-only v0) are ignored, as Stripe's libraries do.
SignatureHeader ParseHeader(std::string_view header) {
  if (header.empty()) Malformed("it is empty");
  if (header.size() > kMaxHeaderBytes) Malformed("it is longer than 8192 bytes");
  SignatureHeader parsed;
  bool has_timestamp = false;
  while (!header.empty()) {
    const auto comma = header.find(',');
    const std::string_view item = Trimmed(header.substr(0, comma));
    header = comma == std::string_view::npos ? std::string_view() : header.substr(comma + 1);
    const auto equals = item.find('=');
    if (equals == std::string_view::npos) Malformed("an element is not scheme=value");
    const std::string_view scheme = item.substr(0, equals);
    const std::string_view value = item.substr(equals + 1);
    if (scheme == "t") {
      if (has_timestamp) Malformed("it has more than one timestamp (t=)");
      if (value.empty() || value.size() > 12 || value.find_first_not_of("0123456789") != value.npos)
        Malformed("the timestamp (t=) is not a number of seconds");
      has_timestamp = true;
      parsed.timestamp = std::stoll(std::string(value));
    } else if (scheme == "v1") {
      parsed.v1.push_back(value);
    }
  }
  if (!has_timestamp) Malformed("it has no timestamp (t=)");
  if (parsed.v1.empty()) Malformed("it has no v1 signature");
  return parsed;
}

std::string ExpectedSignatureHex(std::string_view secret, std::int64_t timestamp,
                                 std::string_view payload) {
  std::string signed_payload = std::to_string(timestamp);
  signed_payload += '.';
  signed_payload.append(payload.data(), payload.size());
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(signed_payload.data()), signed_payload.size(),
           mac, &mac_length) == nullptr) {
    throw std::runtime_error("OpenSSL HMAC-SHA256 failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < mac_length; ++i) {
    hex.push_back(kHex[mac[i] >> 4]);
    hex.push_back(kHex[mac[i] & 0x0f]);
  }
  return hex;
}

}  // namespace

void VerifyStripeSignature(std::string_view payload, std::string_view header,
                           std::string_view secret, std::int64_t now_unix) {
  VerifyStripeSignature(payload, header, std::vector<std::string>{std::string(secret)}, now_unix);
}

void VerifyStripeSignature(std::string_view payload, std::string_view header,
                           const std::vector<std::string>& secrets, std::int64_t now_unix) {
  const SignatureHeader parsed = ParseHeader(header);
  bool matched = false;
  // Every candidate is compared with every secret, in constant time,
  // whatever matched before.
  for (const std::string& secret : secrets) {
    const std::string expected = ExpectedSignatureHex(secret, parsed.timestamp, payload);
    for (const std::string_view candidate : parsed.v1) {
      if (candidate.size() == kSignatureHexLength &&
          CRYPTO_memcmp(candidate.data(), expected.data(), kSignatureHexLength) == 0) {
        matched = true;
      }
    }
  }
  if (!matched) {
    throw InvalidParameter(
        "no v1 signature of the Stripe-Signature header matches the payload: it was signed with "
        "another secret, or the payload was changed");
  }
  const std::int64_t age = now_unix - parsed.timestamp;
  if (age > kSignatureToleranceSeconds) {
    throw InvalidParameter("the Stripe-Signature timestamp is " + std::to_string(age) +
                           " s old, beyond the 300 s tolerance: a replayed or late delivery");
  }
  if (-age > kSignatureToleranceSeconds) {
    throw InvalidParameter("the Stripe-Signature timestamp is " + std::to_string(-age) +
                           " s in the future, beyond the 300 s tolerance");
  }
}

}  // namespace billguard
