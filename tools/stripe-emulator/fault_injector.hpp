// Queued failures for tests to aim at billguard: error statuses, requests
// that never get an answer, and answers lost after the work was committed.
// Faults are consumed in queue order by the next matching requests.
#pragma once

#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace stripe_emulator {

enum class FaultKind {
  status,            // answer with `status` (see StripeApi for what each status does)
  hang,              // read the request, never answer
  commit_then_drop,  // process normally, then close without writing a byte
};

struct Fault {
  FaultKind kind = FaultKind::status;
  int status = 500;
  bool create = true;  // status 500 only: whether the object is created anyway
  // Status 500 only: false fails the request before the endpoint starts
  // executing, which Stripe does not save for the key (nothing created,
  // nothing replayed), as it does with 502-504.
  bool executes = true;
  std::string path_prefix;  // empty: any /v1 path
  // Empty: POST, except that status 429 hits any method (like the real limiter).
  // Otherwise "GET", "POST" or "ANY".
  std::string method;
};

const char* fault_kind_name(FaultKind kind);

class FaultInjector {
 public:
  // Queues `count` repetitions of `fault`; returns the total number queued.
  std::size_t enqueue(const Fault& fault, std::size_t count);

  // Takes one repetition of the oldest queued fault that matches the request.
  std::optional<Fault> take_matching(const std::string& method, const std::string& path);

  struct QueuedFault {
    Fault fault;
    std::size_t remaining;
  };
  std::vector<QueuedFault> queued() const;
  std::size_t total_queued() const;
  void clear();

 private:
  static bool matches(const Fault& fault, const std::string& method, const std::string& path);
  std::size_t total_queued_locked() const;

  mutable std::mutex mutex_;
  std::deque<QueuedFault> queue_;
};

}  // namespace stripe_emulator
