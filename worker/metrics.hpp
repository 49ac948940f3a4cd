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

 private:
  static constexpr std::array<double, 12> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                      0.5,   1,    2.5,   5,    10,  30};
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, unsigned long long> requests_;
  std::array<unsigned long long, kBuckets.size()> upstream_buckets_{};
  unsigned long long upstream_count_ = 0;
  double upstream_sum_ = 0;
};

}  // namespace billguard::proxy
