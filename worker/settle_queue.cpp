// Settles kept until the database takes them (see settle_queue.hpp).
#include "settle_queue.hpp"

#include <cstdio>

namespace billguard::proxy {

namespace {

// Retried at once after a success (the database is back), else after a
// pause that doubles up to a few seconds.
constexpr auto kFirstPause = std::chrono::milliseconds(50);
constexpr auto kLongestPause = std::chrono::seconds(2);

}  // namespace

SettleQueue::SettleQueue(std::function<void(const PendingSettle&)> settle, LedgerCounters& counters,
                         std::size_t max_entries, std::size_t max_bytes)
    : settle_(std::move(settle)),
      counters_(counters),
      max_entries_(max_entries),
      max_bytes_(max_bytes),
      thread_([this] { Run(); }) {}

SettleQueue::~SettleQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
  if (!queue_.empty()) {
    std::fprintf(stderr,
                 "billguard-proxy: stopping with %zu settles the database has not taken; their "
                 "attempts stay in doubt and the reconciler settles them at the next start\n",
                 queue_.size());
  }
}

std::size_t SettleQueue::SizeOf(const PendingSettle& settle) {
  return sizeof settle + settle.key_id.size() + settle.idempotency_key.size() +
         settle.answer.body.size() + settle.answer.error_type.value_or("").size() +
         settle.answer.charge_id.value_or("").size() + settle.answer.request_id.value_or("").size();
}

bool SettleQueue::Keep(PendingSettle settle) {
  const std::size_t size = SizeOf(settle);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queue_.size() >= max_entries_ || bytes_ + size > max_bytes_) {
      ++counters_.settles_dropped;
      return false;
    }
    bytes_ += size;
    queue_.push_back(std::move(settle));
    ++counters_.settles_kept;
    ++counters_.settles_pending;
  }
  changed_.notify_all();
  return true;
}

std::size_t SettleQueue::Pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size();
}

void SettleQueue::Run() {
  auto pause = kFirstPause;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    // The oldest is copied out, so that requests keep queueing meanwhile.
    const PendingSettle oldest = queue_.front();
    lock.unlock();
    bool landed = false;
    try {
      settle_(oldest);
      landed = true;
    } catch (const std::exception& e) {
      // Once per outage, not once per retry.
      if (pause == kFirstPause) {
        const std::string message = e.what();
        std::fprintf(stderr,
                     "billguard-proxy: %zu settles wait for the database (the oldest: %s, "
                     "attempt %d): %s\n",
                     Pending(), oldest.idempotency_key.c_str(), oldest.attempt,
                     message.substr(0, message.find('\n')).c_str());
      }
    }
    lock.lock();
    if (landed) {
      bytes_ -= SizeOf(queue_.front());
      queue_.pop_front();
      ++counters_.settles_landed;
      --counters_.settles_pending;
      pause = kFirstPause;
      continue;
    }
    changed_.wait_for(lock, pause, [&] { return stopping_; });
    pause = std::min<std::chrono::milliseconds>(pause * 2, kLongestPause);
  }
}

}  // namespace billguard::proxy
