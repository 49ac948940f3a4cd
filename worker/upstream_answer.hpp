// Stripe's answer to a forwarded request, as the proxy relays it and the
// ledger settles it. Read in bounded memory, whatever the body holds: the
// proxy never builds the tree of an answer (common/stripe_response.hpp).
#pragma once

#include "http_client.hpp"
#include "ledger.hpp"

namespace billguard::proxy {

// The status, the Request-Id (printable ASCII), the error type of a refusal and the object id of
// a success; the body as text PostgreSQL can store (StorableText), which is
// also what the client is answered, so that a replay from the ledger is the
// same answer byte for byte.
UpstreamAnswer ReadUpstreamAnswer(const HttpResponse& response);

// `bytes` with every byte that is not part of valid UTF-8, and every NUL,
// replaced by U+FFFD: a text column takes it whole, as it came otherwise.
std::string StorableText(const std::string& bytes);

}  // namespace billguard::proxy
