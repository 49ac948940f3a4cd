// What the proxy reads of a Stripe API request before deciding on it: the
// path, the form parameters, the amount, currency and customer, and a
// digest of it all. Strict on purpose: a body the proxy reads one way and
// Stripe another could carry an amount past the cap.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace billguard::proxy {

// Bad input: answered 400 (or 404 for a path) and nothing is decided.
class BadRequest : public std::runtime_error {
 public:
  BadRequest(int http_status, std::string code, const std::string& message)
      : std::runtime_error(message), http_status(http_status), code(std::move(code)) {}
  int http_status;
  std::string code;
};

struct ParsedRequest {
  std::string method;
  std::string path;                                             // /v1/...
  std::string query;                                            // after '?', GET only
  std::vector<std::pair<std::string, std::string>> parameters;  // of a POST, decoded, in order
  std::optional<long long> amount_cents;
  std::optional<std::string> currency;
  std::optional<std::string> customer;
  std::string digest;  // hex SHA-256 of method, path and the sorted parameters
};

// `target` is the request line's target (path and query, undecoded);
// `content_type` and `body` as received. Only a POST's body is read: a GET
// moves no money. Throws BadRequest.
ParsedRequest ParseStripeRequest(const std::string& method, const std::string& target,
                                 const std::string& content_type, const std::string& body);

}  // namespace billguard::proxy
