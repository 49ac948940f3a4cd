// What of a client's headers reaches Stripe: an allowlist the proxy builds,
// never the client's lines. Idempotency-Key, Stripe-Version and
// Stripe-Account are checked here; the proxy adds its own Authorization and
// Content-Type
// (upstream.hpp). Every other header of the client stays here.
#pragma once

#include <optional>
#include <string>

#include "http_message.hpp"
#include "stripe_request_parser.hpp"

namespace billguard::proxy {

class ForwardedHeaders {
 public:
  // None of the client's: for a request the proxy makes of its own.
  ForwardedHeaders() = default;

  // For a look-up of the proxy's own on a connected account (absent: the
  // platform's): Stripe-Account alone.
  static ForwardedHeaders OnAccount(const std::optional<std::string>& stripe_account);

  // Throws BadRequest: an Idempotency-Key that is not 1-255 printable
  // ASCII characters or is blank, a Stripe-Version that is not a version
  // (2024-06-20, 2025-03-31.basil), a Stripe-Account that is not an
  // account id (acct_ and letters or digits), or Stripe-Context, which
  // makes Stripe act on an account the ledger cannot name, and which
  // dropping would turn into a charge on the platform's. Whether the
  // account is one the key's budget may spend on is the ledger's decision.
  static ForwardedHeaders Of(const Request& request);

  // Absent: the client sent none.
  const std::optional<std::string>& idempotency_key() const { return idempotency_key_; }
  const std::optional<std::string>& stripe_version() const { return stripe_version_; }
  const std::optional<std::string>& stripe_account() const { return stripe_account_; }

 private:
  std::optional<std::string> idempotency_key_;
  std::optional<std::string> stripe_version_;
  std::optional<std::string> stripe_account_;
};

// Whether a request may move money without an amount the ledger counts,
// so that only its Idempotency-Key can name it: every POST but a cancel
// (confirm, capture, an update, an action such as an invoice's pay).
// Without a key such a request is refused: the ledger cannot count what it
// cannot name, and a retry would be a second request at Stripe.
bool NeedsIdempotencyKey(const ParsedRequest& request);

}  // namespace billguard::proxy
