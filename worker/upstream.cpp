// Forwarding to Stripe (see upstream.hpp).
#include "upstream.hpp"

namespace billguard::proxy {

Upstream::Upstream(std::string base_url, std::string api_key, long timeout_ms)
    : base_url_(std::move(base_url)),
      authorization_("Authorization: Bearer " + api_key),
      timeout_ms_(timeout_ms) {}

HttpResponse Upstream::Send(const std::string& method, const std::string& path_and_query,
                            const std::string& body, const ForwardedHeaders& headers) const {
  thread_local HttpClient client(timeout_ms_);
  HttpRequest request;
  request.post = method == "POST";
  request.url = base_url_ + path_and_query;
  request.headers.push_back(authorization_);
  if (request.post) {
    request.headers.push_back("Content-Type: application/x-www-form-urlencoded");
    request.body = body;
  }
  if (const auto& key = headers.idempotency_key()) {
    request.headers.push_back("Idempotency-Key: " + *key);
  }
  if (const auto& version = headers.stripe_version()) {
    request.headers.push_back("Stripe-Version: " + *version);
  }
  if (const auto& account = headers.stripe_account()) {
    request.headers.push_back("Stripe-Account: " + *account);
  }
  client.Submit(std::move(request));
  for (;;) {
    auto finished = client.Poll(1000);
    if (!finished.empty()) return std::move(finished.front());
  }
}

}  // namespace billguard::proxy
