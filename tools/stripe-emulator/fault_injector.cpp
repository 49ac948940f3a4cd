#include "fault_injector.hpp"

namespace stripe_emulator {

const char* fault_kind_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::status:
      return "status";
    case FaultKind::hang:
      return "hang";
    case FaultKind::commit_then_drop:
      return "commit_then_drop";
  }
  return "status";
}

bool FaultInjector::matches(const Fault& fault, const std::string& method,
                            const std::string& path) {
  if (path.compare(0, fault.path_prefix.size(), fault.path_prefix) != 0) return false;
  if (fault.method == "ANY") return true;
  if (!fault.method.empty()) return fault.method == method;
  const bool rate_limit_style = fault.kind == FaultKind::status && fault.status == 429;
  return rate_limit_style || method == "POST";
}

std::size_t FaultInjector::total_queued_locked() const {
  std::size_t total = 0;
  for (const auto& queued : queue_) total += queued.remaining;
  return total;
}

std::size_t FaultInjector::enqueue(const Fault& fault, std::size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (count > 0) queue_.push_back(QueuedFault{fault, count});
  return total_queued_locked();
}

std::optional<Fault> FaultInjector::take_matching(const std::string& method,
                                                  const std::string& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (!matches(it->fault, method, path)) continue;
    Fault taken = it->fault;
    if (--it->remaining == 0) queue_.erase(it);
    return taken;
  }
  return std::nullopt;
}

std::vector<FaultInjector::QueuedFault> FaultInjector::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {queue_.begin(), queue_.end()};
}

std::size_t FaultInjector::total_queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_queued_locked();
}

void FaultInjector::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.clear();
}

}  // namespace stripe_emulator
