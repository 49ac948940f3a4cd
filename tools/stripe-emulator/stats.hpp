// Counters for the control API's /_emulator/stats. Atomics rather than a
// mutex: they are bumped on every request and read rarely.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace stripe_emulator {

class Stats {
 public:
  std::atomic<std::uint64_t> requests{0};  // /v1 requests received
  std::atomic<std::uint64_t> created{0};   // objects created
  std::atomic<std::uint64_t> replayed{0};  // saved responses replayed
  std::atomic<std::uint64_t> rate_limited{0};
  std::atomic<std::uint64_t> idempotency_conflicts{0};  // same key, different request
  std::atomic<std::uint64_t> in_use_conflicts{0};       // same key while executing (409)
  std::atomic<std::uint64_t> faults_applied{0};

  // A /v1 request started or finished processing; tracks the peak overlap,
  // which shows how much concurrency a client really achieved.
  void request_started();
  void request_finished();

  void reset();
  std::string to_json() const;

 private:
  std::atomic<std::int64_t> in_progress_{0};
  std::atomic<std::int64_t> max_concurrent_{0};
};

// Marks one /v1 request as in progress for its whole lifetime.
class InProgressRequest {
 public:
  explicit InProgressRequest(Stats& stats) : stats_(stats) { stats_.request_started(); }
  ~InProgressRequest() { stats_.request_finished(); }
  InProgressRequest(const InProgressRequest&) = delete;
  InProgressRequest& operator=(const InProgressRequest&) = delete;

 private:
  Stats& stats_;
};

}  // namespace stripe_emulator
