// What the proxy's request handlers share.
#pragma once

#include <map>
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
  // The largest new budget the issuer token creates: in USD (empty: none
  // unless issuer_max_period names usd), and per other currency named by
  // --issuer-max-period (currency -> amount in its major unit).
  const std::string issuer_max_period_usd;
  const std::map<std::string, std::string> issuer_max_period;
  const bool livemode;  // the upstream key is a live key: vault keys are vk_live_
};

// A JSON answer; Stripe-shaped for errors (stripe_errors.hpp).
inline void AnswerJson(Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

}  // namespace billguard::proxy
