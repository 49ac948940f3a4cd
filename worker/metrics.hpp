// The proxy's Prometheus metrics: requests by decision and status, the
// latency of Stripe's answers, and each budget's cap and spend (read from
// the ledger at every scrape).
#pragma once

#include <array>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ledger.hpp"
#include "ledger_counters.hpp"

namespace billguard::proxy {

class Metrics {
 public:
  // decision: the ledger's (forwarded, reserved, reused, replayed, refused)
  // or the proxy's own (rejected: bad input or credentials; unavailable:
  // no database).
  void CountRequest(const std::string& decision, int http_status);
  void ObserveUpstream(double seconds);

  // The text exposition format; `budgets` are vault_spend rows, absent
  // when the ledger could not be read.
  std::string Render(const std::vector<Row>* budgets) const;

  // What the ledger's settle queue, reconciler and pool did (ledger.hpp).
  LedgerCounters& ledger_counters() { return ledger_counters_; }

 private:
  LedgerCounters ledger_counters_;
  static constexpr std::array<double, 12> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                      0.5,   1,    2.5,   5,    10,  30};
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, unsigned long long> requests_;
  std::array<unsigned long long, kBuckets.size()> upstream_buckets_{};
  unsigned long long upstream_count_ = 0;
  double upstream_sum_ = 0;
};

// Counts one request when it goes out of scope, with the HTTP status its
// answer has then: every return of a handler is counted, refusals too.
class CountedRequest {
 public:
  CountedRequest(Metrics& metrics, std::string decision, const int& http_status)
      : metrics_(metrics), decision_(std::move(decision)), http_status_(http_status) {}
  ~CountedRequest() { metrics_.CountRequest(decision_, http_status_); }
  CountedRequest(const CountedRequest&) = delete;
  CountedRequest& operator=(const CountedRequest&) = delete;

 private:
  Metrics& metrics_;
  const std::string decision_;
  const int& http_status_;
};

}  // namespace billguard::proxy
