// Request pacing for the dispatcher. Pure C++.
//
// Requests start evenly spaced at 98% of the configured rate, with no burst
// beyond 5 ms of catch-up for the dispatcher's own loop (a pass that ran a
// transaction sends what came due meanwhile at once): a limiter that counts
// requests in any rolling second sees at most 98.5% of the limit. A 429
// halves the rate, which recovers linearly over 10 seconds.
#pragma once

#include "cpp_only.hpp"

#include <algorithm>
#include <chrono>

namespace billguard {

class RatePacer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RatePacer(double per_second) { set_rate(per_second); }

  void set_rate(double per_second) { configured_ = std::max(per_second, 0.1); }

  static constexpr Clock::duration kCatchUp = std::chrono::milliseconds(5);

  // May one more request start at `now`?
  bool Ready(Clock::time_point now) const { return now >= next_; }

  void Take(Clock::time_point now) {
    const auto interval =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / Rate(now)));
    next_ = std::max(next_, now - kCatchUp) + interval;
  }

  // Time until the next request may start (zero when one may start now).
  Clock::duration UntilNext(Clock::time_point now) const {
    return now >= next_ ? Clock::duration::zero() : next_ - now;
  }

  void SlowDown(Clock::time_point now) {
    slowed_at_ = now;
    slowed_ = true;
  }

  double Rate(Clock::time_point now) const {
    const double full = configured_ * 0.98;
    if (!slowed_) return full;
    const double recovered =
        std::min(1.0, std::chrono::duration<double>(now - slowed_at_).count() / 10.0);
    return full * (0.5 + 0.5 * recovered);
  }

 private:
  double configured_ = 25;
  Clock::time_point next_{};
  Clock::time_point slowed_at_{};
  bool slowed_ = false;
};

}  // namespace billguard
