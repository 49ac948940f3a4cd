// What the ledger is asked about a forwarded request (ledger.hpp's
// ForwardedRequest), built from the parsed request and the headers the
// proxy forwards. Its digest covers every forwarded header that changes
// Stripe's answer: the same Idempotency-Key with another Stripe-Version is
// another request (one version may refuse what another charged), so the
// ledger refuses it as Stripe's idempotency_error instead of letting its
// refusal release the amount an earlier attempt may have charged. A header
// that joins the forwarded ones and changes Stripe's answer (Stripe-Account
// does: another account's objects, another account's idempotency) joins
// the digest here.
#pragma once

#include <string>

#include "forwarded_headers.hpp"
#include "ledger.hpp"
#include "stripe_request_parser.hpp"

namespace billguard::proxy {

// `credential` is the vault key presented; `headers` the client's headers
// that reach Stripe (forwarded_headers.hpp).
ForwardedRequest LedgerRequest(const ParsedRequest& parsed, const std::string& credential,
                               const ForwardedHeaders& headers);

// The digest of a parsed request as forwarded with these headers.
std::string ForwardedDigest(const ParsedRequest& parsed, const ForwardedHeaders& headers);

}  // namespace billguard::proxy
