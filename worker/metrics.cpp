// Prometheus text exposition (see metrics.hpp).
#include "metrics.hpp"

#include <sstream>

namespace billguard::proxy {

namespace {

// A label value as the exposition format quotes it.
std::string Quoted(const std::string& value) {
  std::string out = "\"";
  for (char c : value) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out + "\"";
}

std::string Field(const Row& row, const std::string& name) {
  for (const auto& [column, value] : row) {
    if (column == name) return value.value_or("");
  }
  return "";
}

}  // namespace

void Metrics::CountRequest(const std::string& decision, int http_status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{decision, http_status}];
}

void Metrics::ObserveUpstream(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) ++upstream_buckets_[i];
  }
  ++upstream_count_;
  upstream_sum_ += seconds;
}

std::string Metrics::Render(const std::vector<Row>* budgets) const {
  std::ostringstream out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out << "# HELP billguard_proxy_requests_total Requests answered, by the proxy's decision and "
           "HTTP status.\n"
        << "# TYPE billguard_proxy_requests_total counter\n";
    for (const auto& [key, count] : requests_) {
      out << "billguard_proxy_requests_total{decision=" << Quoted(key.first) << ",status=\""
          << key.second << "\"} " << count << "\n";
    }
    out << "# HELP billguard_proxy_upstream_seconds Time Stripe took to answer a forwarded "
           "request.\n"
        << "# TYPE billguard_proxy_upstream_seconds histogram\n";
    for (std::size_t i = 0; i < kBuckets.size(); ++i) {
      out << "billguard_proxy_upstream_seconds_bucket{le=\"" << kBuckets[i] << "\"} "
          << upstream_buckets_[i] << "\n";
    }
    out << "billguard_proxy_upstream_seconds_bucket{le=\"+Inf\"} " << upstream_count_ << "\n"
        << "billguard_proxy_upstream_seconds_sum " << upstream_sum_ << "\n"
        << "billguard_proxy_upstream_seconds_count " << upstream_count_ << "\n";
  }
  const LedgerCounters& c = ledger_counters_;
  out << "# HELP billguard_proxy_settles_pending Settles the database has not taken yet, kept "
         "and retried.\n"
      << "# TYPE billguard_proxy_settles_pending gauge\n"
      << "billguard_proxy_settles_pending " << c.settles_pending.load() << "\n"
      << "# HELP billguard_proxy_settles_total Settles the database did not take at once: kept, "
         "landed later, or dropped (refused for good, or no room: left to the reconciler).\n"
      << "# TYPE billguard_proxy_settles_total counter\n"
      << "billguard_proxy_settles_total{result=\"kept\"} " << c.settles_kept.load() << "\n"
      << "billguard_proxy_settles_total{result=\"landed\"} " << c.settles_landed.load() << "\n"
      << "billguard_proxy_settles_total{result=\"dropped\"} " << c.settles_dropped.load() << "\n"
      << "# HELP billguard_proxy_reconciliations_total Reserved keys looked up at Stripe, by "
         "what the ledger made of the finding.\n"
      << "# TYPE billguard_proxy_reconciliations_total counter\n";
  const std::pair<const char*, unsigned long long> reconciled[] = {
      {"settled", c.reconciled_settled.load()},
      {"released", c.reconciled_released.load()},
      {"unknown", c.reconciled_unknown.load()},
      {"stale", c.reconciled_stale.load()}};
  for (const auto& [result, count] : reconciled) {
    out << "billguard_proxy_reconciliations_total{result=\"" << result << "\"} " << count << "\n";
  }
  out << "# HELP billguard_proxy_database_connections_replaced_total Pooled connections the "
         "server had closed, replaced before use.\n"
      << "# TYPE billguard_proxy_database_connections_replaced_total counter\n"
      << "billguard_proxy_database_connections_replaced_total " << c.connections_replaced.load()
      << "\n"
      << "# HELP billguard_proxy_database_calls_retried_total Ledger calls run again after their "
         "connection broke under them.\n"
      << "# TYPE billguard_proxy_database_calls_retried_total counter\n"
      << "billguard_proxy_database_calls_retried_total " << c.calls_retried.load() << "\n";
  out << "# HELP billguard_proxy_ledger_up Whether the spend-cap ledger could be read.\n"
      << "# TYPE billguard_proxy_ledger_up gauge\n"
      << "billguard_proxy_ledger_up " << (budgets != nullptr ? 1 : 0) << "\n";
  if (budgets == nullptr) return out.str();
  static const std::pair<const char*, const char*> kGauges[] = {
      {"cap_cents", "The budget's spend cap, in its currency's smallest unit (cents)."},
      {"settled_cents",
       "Charges Stripe confirmed against the budget, in its currency's smallest unit."},
      {"reserved_cents",
       "Charges in flight or of unknown outcome, in its currency's smallest unit."}};
  for (const auto& [column, help] : kGauges) {
    out << "# HELP billguard_proxy_budget_" << column << " " << help << "\n"
        << "# TYPE billguard_proxy_budget_" << column << " gauge\n";
    for (const Row& row : *budgets) {
      out << "billguard_proxy_budget_" << column << "{vendor=" << Quoted(Field(row, "vendor"))
          << ",billing_period=" << Quoted(Field(row, "billing_period"))
          << ",currency=" << Quoted(Field(row, "currency")) << "} " << Field(row, column) << "\n";
    }
  }
  return out.str();
}

}  // namespace billguard::proxy
