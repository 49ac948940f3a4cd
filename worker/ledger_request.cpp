// The ledger's view of a forwarded request (see ledger_request.hpp).
#include "ledger_request.hpp"

#include "sha256.hpp"

namespace billguard::proxy {

namespace {

// The name the dispatcher gives every charge (metadata[billguard_key]): the
// reconciler searches Stripe by it.
constexpr const char* kSearchKeyParameter = "metadata[billguard_key]";

}  // namespace

std::string ForwardedDigest(const ParsedRequest& parsed, const ForwardedHeaders& headers) {
  // Without the headers the digest is the parameters' alone (as before
  // Stripe-Account was taken, so a ledger's digests stay valid); with them,
  // each is length-prefixed after them, so no value can pose as another.
  const auto& version = headers.stripe_version();
  const auto& account = headers.stripe_account();
  if (!version && !account) return parsed.digest;
  std::string digested = parsed.digest;
  if (version) {
    digested += "\nStripe-Version:" + std::to_string(version->size()) + ":" + *version;
  }
  if (account) {
    digested += "\nStripe-Account:" + std::to_string(account->size()) + ":" + *account;
  }
  return Sha256Hex(digested);
}

ForwardedRequest LedgerRequest(const ParsedRequest& parsed, const std::string& credential,
                               const ForwardedHeaders& headers) {
  ForwardedRequest request;
  request.secret_sha256 = Sha256Bytes(credential);
  request.method = parsed.method;
  request.endpoint = parsed.path;
  request.idempotency_key = headers.idempotency_key();
  request.request_digest = ForwardedDigest(parsed, headers);
  request.amount_cents = parsed.amount_cents;
  request.currency = parsed.currency;
  request.customer = parsed.customer;
  request.stripe_account = headers.stripe_account();
  // Given twice, Stripe keeps one of them: which one is not ours to guess.
  int given = 0;
  for (const auto& [name, value] : parsed.parameters) {
    if (name != kSearchKeyParameter) continue;
    ++given;
    if (!value.empty() && value.size() <= 500) request.search_key = value;
  }
  if (given != 1) request.search_key.reset();
  return request;
}

}  // namespace billguard::proxy
