// The proxy's key API: POST /keys (issuer or admin token), and GET, DELETE
// and POST /keys/{key_id} (admin token: read, revoke, raise the cap).
#pragma once

#include "proxy_context.hpp"
#include "router.hpp"

namespace billguard::proxy {

void RegisterKeysApi(Router& router, ProxyContext& context);

}  // namespace billguard::proxy
