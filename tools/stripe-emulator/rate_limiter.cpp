#include "rate_limiter.hpp"

namespace stripe_emulator {

void RollingWindowRateLimiter::set_limit(std::int64_t per_second) {
  std::lock_guard<std::mutex> lock(mutex_);
  limit_.store(per_second < 0 ? 0 : per_second);
  admissions_.clear();
}

bool RollingWindowRateLimiter::try_admit() {
  if (limit_.load(std::memory_order_relaxed) == 0) return true;  // off: no lock on the hot path
  std::lock_guard<std::mutex> lock(mutex_);
  const std::int64_t limit = limit_.load();
  if (limit == 0) return true;
  const auto now = Clock::now();
  const auto window_start = now - std::chrono::seconds(1);
  while (!admissions_.empty() && admissions_.front() <= window_start) admissions_.pop_front();
  if (static_cast<std::int64_t>(admissions_.size()) >= limit) return false;
  admissions_.push_back(now);
  return true;
}

void RollingWindowRateLimiter::forget_history() {
  std::lock_guard<std::mutex> lock(mutex_);
  admissions_.clear();
}

}  // namespace stripe_emulator
