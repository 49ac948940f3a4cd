// The part of an HTTP answer that Stripe's idempotency layer saves and
// replays: status and body. Headers are regenerated per response.
#pragma once

#include <string>

namespace stripe_emulator {

struct ApiResponse {
  int status = 200;
  std::string body;  // always JSON
};

}  // namespace stripe_emulator
