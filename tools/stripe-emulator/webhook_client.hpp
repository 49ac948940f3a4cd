// The emulator's one outgoing request: POST of a webhook delivery to the
// configured endpoint, over plain HTTP/1.1 on a fresh connection. Endpoints
// are test servers (billguard-proxy, a test's listener), so http:// only.
#pragma once

#include <string>

#include "http_exchange.hpp"

namespace stripe_emulator {

struct WebhookEndpoint {
  std::string host;  // brackets of an IPv6 literal removed
  std::string port;
  std::string path;  // with the query, if any
};

// Parses "http://HOST[:PORT][/PATH]"; false, with `error` saying why, for
// anything else.
bool parse_webhook_url(const std::string& url, WebhookEndpoint& endpoint, std::string& error);

struct PostResult {
  int status = 0;     // 0: no HTTP answer
  std::string error;  // why there was none
};

// Sends the request and reads the status line of the answer, within
// `timeout_ms` for each step.
PostResult post_webhook(const WebhookEndpoint& endpoint, const HeaderList& headers,
                        const std::string& body, int timeout_ms);

}  // namespace stripe_emulator
