// The /_emulator control API that tests use to inspect and steer the
// emulator: ledger, faults, reset, stats and run-time config. It answers
// loopback clients only, since it can rewrite what the "Stripe" side saw.
//
//   GET  /_emulator/ledger   every object created, in creation order
//   POST /_emulator/faults   queue faults; GET lists the queue
//   POST /_emulator/reset    forget ledger, keys, faults and stats
//   GET  /_emulator/stats    request counters
//   POST /_emulator/config   change latency_ms, rate_limit, search_delay_ms,
//                            idempotency_ttl; GET shows them
//   POST /_emulator/webhooks change where and how webhooks are delivered;
//                            GET shows that and every delivery
//   POST /_emulator/webhooks/resend  deliver one event again
//   POST /_emulator/refunds  refund a charge, as a person in Stripe's
//                            dashboard would: charge.refunded follows
#pragma once

#include "emulator_state.hpp"
#include "http_exchange.hpp"

namespace stripe_emulator {

class ControlApi {
 public:
  explicit ControlApi(EmulatorState& state) : state_(state) {}

  HandlerResult handle(const HttpRequest& request);

 private:
  ApiResponse ledger() const;
  ApiResponse queue_faults(const std::string& body);
  ApiResponse list_faults() const;
  ApiResponse reset();
  ApiResponse update_config(const std::string& body);
  ApiResponse config() const;
  ApiResponse update_webhooks(const std::string& body);
  ApiResponse resend_webhook(const std::string& body);
  ApiResponse refund(const std::string& body);

  EmulatorState& state_;
};

}  // namespace stripe_emulator
