#include "stats.hpp"

#include "json.hpp"

namespace stripe_emulator {

void Stats::request_started() {
  const std::int64_t now_in_progress = ++in_progress_;
  std::int64_t peak = max_concurrent_.load();
  while (now_in_progress > peak && !max_concurrent_.compare_exchange_weak(peak, now_in_progress)) {
  }
}

void Stats::request_finished() {
  --in_progress_;
}

void Stats::reset() {
  requests = 0;
  created = 0;
  replayed = 0;
  rate_limited = 0;
  idempotency_conflicts = 0;
  in_use_conflicts = 0;
  faults_applied = 0;
  max_concurrent_ = in_progress_.load();  // requests still running keep counting
}

std::string Stats::to_json() const {
  const auto count = [](const std::atomic<std::uint64_t>& counter) {
    return static_cast<std::int64_t>(counter.load());
  };
  JsonWriter json;
  json.begin_object()
      .key("requests")
      .integer(count(requests))
      .key("created")
      .integer(count(created))
      .key("replayed")
      .integer(count(replayed))
      .key("rate_limited")
      .integer(count(rate_limited))
      .key("idempotency_conflicts")
      .integer(count(idempotency_conflicts))
      .key("in_use_conflicts")
      .integer(count(in_use_conflicts))
      .key("faults_applied")
      .integer(count(faults_applied))
      .key("max_concurrent")
      .integer(max_concurrent_.load())
      .key("in_progress")
      .integer(in_progress_.load())
      .end_object();
  return json.take();
}

}  // namespace stripe_emulator
