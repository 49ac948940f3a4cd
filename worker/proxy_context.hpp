// What the proxy's request handlers share.
#pragma once

#include <optional>
#include <string>

#include "http_message.hpp"
#include "ledger.hpp"
#include "metrics.hpp"
#include "upstream.hpp"

namespace billguard::proxy {

struct ProxyContext {
  Ledger& ledger;
  const Upstream& upstream;
  Metrics& metrics;
  const std::string admin_token;
  const std::optional<std::string> issuer_token;
  const std::string issuer_max_period_usd;  // USD: the largest budget the issuer creates
  const bool livemode;  // the upstream key is a live key: vault keys are vk_live_
};

// A JSON answer; Stripe-shaped for errors (stripe_errors.hpp).
inline void AnswerJson(Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

}  // namespace billguard::proxy
