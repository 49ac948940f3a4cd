// Settles the database did not take when Stripe answered (a restart, a
// connection lost, a statement cancelled): kept in memory and retried, the
// oldest first, until the database takes them. A charge Stripe made must
// not stay "reserved" in the ledger: its key, back after Stripe has
// forgotten it, would be a second charge. Memory is bounded; a settle that
// finds no room, or is lost with the process (kill -9, a crash), leaves its
// attempt in doubt in the ledger, and the reconciler (reconciler.hpp)
// settles the reservation from what Stripe holds: nothing is lost, only
// learnt again.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "ledger.hpp"
#include "ledger_counters.hpp"

namespace billguard::proxy {

struct PendingSettle {
  std::string key_id;
  std::string idempotency_key;
  int attempt = 0;
  UpstreamAnswer answer;
  std::optional<std::string> stripe_account;  // the connected account acted on
};

class SettleQueue {
 public:
  // `settle` records one in the database and throws when it cannot now.
  SettleQueue(std::function<void(const PendingSettle&)> settle, LedgerCounters& counters,
              std::size_t max_entries, std::size_t max_bytes);
  ~SettleQueue();
  SettleQueue(const SettleQueue&) = delete;
  SettleQueue& operator=(const SettleQueue&) = delete;

  // Keeps it to be retried; false when there is no room for it.
  bool Keep(PendingSettle settle);
  std::size_t Pending() const;

 private:
  static std::size_t SizeOf(const PendingSettle& settle);
  void Run();

  const std::function<void(const PendingSettle&)> settle_;
  LedgerCounters& counters_;
  const std::size_t max_entries_;
  const std::size_t max_bytes_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<PendingSettle> queue_;
  std::size_t bytes_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace billguard::proxy
