// Stripe's request rate limiter, which sits in front of authentication and
// the idempotency layer (so a retried 429 can succeed).
//
// This is an exact rolling window, not a token bucket: it admits a request
// only if fewer than N requests were admitted in the preceding second, so no
// 1-second window ever holds more than N admissions. (A token bucket of
// capacity N can admit up to 2N in a window straddling a refill.)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>

namespace stripe_emulator {

class RollingWindowRateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RollingWindowRateLimiter(std::int64_t per_second) { set_limit(per_second); }

  // 0 turns limiting off. Changing the limit forgets past admissions.
  void set_limit(std::int64_t per_second);
  std::int64_t limit() const { return limit_.load(); }

  // Reads the clock under the lock so admissions are recorded in order.
  bool try_admit();
  void forget_history();

 private:
  std::atomic<std::int64_t> limit_{0};
  std::mutex mutex_;
  std::deque<Clock::time_point> admissions_;  // within the last second, oldest first
};

}  // namespace stripe_emulator
