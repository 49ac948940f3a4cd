// Forwarding one request to Stripe with the real key, over the libcurl
// client the dispatcher uses (common/http_client.hpp). Each serving thread
// keeps its own client, and so its own kept-alive connections.
#pragma once

#include <string>

#include "forwarded_headers.hpp"
#include "http_client.hpp"

namespace billguard::proxy {

class Upstream {
 public:
  Upstream(std::string base_url, std::string api_key, long timeout_ms);

  // Sends method (GET or POST) path_and_query with the body, the real key
  // and, of the caller's headers, only the checked ones (forwarded_headers.hpp).
  // Status 0 when no answer arrived within the timeout.
  HttpResponse Send(const std::string& method, const std::string& path_and_query,
                    const std::string& body, const ForwardedHeaders& headers) const;

 private:
  const std::string base_url_;
  const std::string authorization_;
  const long timeout_ms_;
};

}  // namespace billguard::proxy
