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
  // Without the header the digest is the parameters' alone; with it, the
  // version is length-prefixed after them, so no value can pose as another.
  const auto& version = headers.stripe_version();
  if (!version) return parsed.digest;
  return Sha256Hex(parsed.digest + "\nStripe-Version:" + std::to_string(version->size()) + ":" +
                   *version);
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
