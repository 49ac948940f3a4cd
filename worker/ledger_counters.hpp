// What the ledger's own machinery did, for /metrics: settles the database
// did not take at once (settle_queue.hpp), reservations reconciled with
// Stripe (reconciler.hpp), pooled connections found broken and replaced
// (database_pool.hpp). Atomic: written by request threads and the
// background threads, read at every scrape.
#pragma once

#include <atomic>

namespace billguard::proxy {

struct LedgerCounters {
  std::atomic<unsigned long long> settles_kept{0};     // failed at first, kept to retry
  std::atomic<unsigned long long> settles_landed{0};   // of those, taken by the database later
  std::atomic<unsigned long long> settles_dropped{0};  // not kept: refused for good, or no room
  std::atomic<long long> settles_pending{0};
  std::atomic<unsigned long long> reconciled_settled{0};
  std::atomic<unsigned long long> reconciled_released{0};
  std::atomic<unsigned long long> reconciled_unknown{0};
  std::atomic<unsigned long long> reconciled_stale{0};
  std::atomic<unsigned long long> connections_replaced{0};
  std::atomic<unsigned long long> calls_retried{0};
};

}  // namespace billguard::proxy
