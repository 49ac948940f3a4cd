// Everything the request handlers share. Each member guards itself (its own
// mutex or atomics), so no handler ever holds a lock across a sleep or I/O.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "fault_injector.hpp"
#include "idempotency_store.hpp"
#include "object_ledger.hpp"
#include "rate_limiter.hpp"
#include "refused_accounts.hpp"
#include "stats.hpp"
#include "webhook_sender.hpp"

namespace stripe_emulator {

// Settings the control API may change while the emulator runs, so one
// emulator can serve several benchmark phases.
struct RuntimeSettings {
  std::atomic<std::int64_t> latency_ms{0};
  std::atomic<std::int64_t> search_delay_ms{0};
  std::atomic<std::int64_t> idempotency_ttl_seconds{86400};
};

struct EmulatorState {
  EmulatorState(std::int64_t rate_limit_per_second, bool log_webhooks)
      : rate_limiter(rate_limit_per_second), webhooks(log_webhooks) {}

  std::optional<std::string> required_api_key;  // nullopt: any non-empty key is accepted
  // The account's API version, for requests without Stripe-Version.
  std::string default_api_version = "2020-08-27";
  RuntimeSettings settings;
  RefusedAccounts refused_accounts;
  RollingWindowRateLimiter rate_limiter;
  IdempotencyStore idempotency;
  FaultInjector faults;
  Ledger ledger;
  Stats stats;
  WebhookSender webhooks;
};

}  // namespace stripe_emulator
