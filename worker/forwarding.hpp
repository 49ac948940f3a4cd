// The proxy's core: a Stripe API request made with a vault key is parsed,
// authorized by the ledger, forwarded with the real key, and Stripe's
// answer relayed and settled in the ledger.
#pragma once

#include "proxy_context.hpp"

namespace billguard::proxy {

void HandleStripeRequest(ProxyContext& context, const Request& req, Response& res);

}  // namespace billguard::proxy
