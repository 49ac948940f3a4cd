// Verifying the Stripe-Signature header of a webhook delivery. Pure C++.
//
// Stripe signs every delivery: `Stripe-Signature: t=<unix time>,v1=<hex>`,
// where each v1 is the HMAC-SHA256 of "<t>.<raw body>" keyed with the
// endpoint's signing secret (whsec_...). While a secret is being rolled,
// Stripe signs with the old and the new one, so several v1 may come; any
// one that matches is enough. The timestamp bounds how long a captured
// delivery can be replayed.
#pragma once

#include "cpp_only.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace billguard {

// How far the signed timestamp may be from now, either way (Stripe's
// libraries default to five minutes).
constexpr std::int64_t kSignatureToleranceSeconds = 300;

// Throws InvalidParameter saying what is wrong (a malformed header, no
// matching signature, a timestamp outside the tolerance) unless `header`
// carries a v1 signature of `payload` made with one of `secrets` (the
// secret of each endpoint the database hears: an account endpoint and a
// Connect endpoint have their own) within the tolerance of `now_unix`.
// Signatures are compared in constant time, each with every secret; no
// message holds a secret or the signature expected.
void VerifyStripeSignature(std::string_view payload, std::string_view header,
                           const std::vector<std::string>& secrets, std::int64_t now_unix);
void VerifyStripeSignature(std::string_view payload, std::string_view header,
                           std::string_view secret, std::int64_t now_unix);

}  // namespace billguard
