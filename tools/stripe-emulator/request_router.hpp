// Sends each request to the Stripe API (/v1) or the control API (/_emulator).
#pragma once

#include "control_api.hpp"
#include "emulator_state.hpp"
#include "http_exchange.hpp"
#include "stripe_api.hpp"

namespace stripe_emulator {

class RequestRouter {
 public:
  explicit RequestRouter(EmulatorState& state) : stripe_api_(state), control_api_(state) {}

  HandlerResult route(const HttpRequest& request);

 private:
  StripeApi stripe_api_;
  ControlApi control_api_;
};

}  // namespace stripe_emulator
