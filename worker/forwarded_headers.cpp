// The headers forwarded to Stripe (see forwarded_headers.hpp).
#include "forwarded_headers.hpp"

#include <algorithm>
#include <regex>

namespace billguard::proxy {

namespace {

bool Printable(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

}  // namespace

ForwardedHeaders ForwardedHeaders::OnAccount(const std::optional<std::string>& stripe_account) {
  ForwardedHeaders headers;
  headers.stripe_account_ = stripe_account;
  return headers;
}

ForwardedHeaders ForwardedHeaders::Of(const Request& request) {
  if (request.has_header("Stripe-Context")) {
    throw BadRequest(400, "header_not_allowed",
                     "the spend-cap proxy acts on its own Stripe account and on the connected "
                     "accounts a budget names (Stripe-Account): Stripe-Context is not taken");
  }
  ForwardedHeaders headers;
  if (request.has_header("Stripe-Account")) {
    static const std::regex kAccount("acct_[A-Za-z0-9]{1,250}");
    const std::string account = request.get_header_value("Stripe-Account");
    if (!std::regex_match(account, kAccount)) {
      throw BadRequest(400, "stripe_account_invalid",
                       "Stripe-Account must be a connected account id such as "
                       "acct_1Nv0FGQ9RKHgCVdK");
    }
    headers.stripe_account_ = account;
  }
  if (request.has_header("Idempotency-Key")) {
    const std::string key = request.get_header_value("Idempotency-Key");
    const bool blank = key.find_first_not_of(' ') == std::string::npos;
    if (key.size() > 255 || blank || !Printable(key)) {
      throw BadRequest(400, "idempotency_key_invalid",
                       "Idempotency-Key must be 1..255 printable ASCII characters, not blank");
    }
    headers.idempotency_key_ = key;
  }
  if (request.has_header("Stripe-Version")) {
    static const std::regex kVersion("[0-9]{4}-[0-9]{2}-[0-9]{2}(\\.[a-z]{1,32})?");
    const std::string version = request.get_header_value("Stripe-Version");
    if (!std::regex_match(version, kVersion)) {
      throw BadRequest(400, "stripe_version_invalid",
                       "Stripe-Version must be an API version such as 2024-06-20 or "
                       "2025-03-31.basil");
    }
    headers.stripe_version_ = version;
  }
  return headers;
}

bool NeedsIdempotencyKey(const ParsedRequest& request) {
  if (request.method != "POST") return false;
  const std::string last = request.path.substr(request.path.rfind('/') + 1);
  return last != "cancel";
}

}  // namespace billguard::proxy
