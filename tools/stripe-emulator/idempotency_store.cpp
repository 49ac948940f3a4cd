#include "idempotency_store.hpp"

#include <algorithm>

namespace stripe_emulator {

std::string IdempotencyStore::scoped_key(const std::string& scope,
                                         const std::string& idempotency_key) {
  // A NUL cannot occur in an HTTP header value, so the pair is unambiguous.
  std::string scoped = scope;
  scoped += '\0';
  scoped += idempotency_key;
  return scoped;
}

void IdempotencyStore::prune_expired(Clock::time_point now, std::chrono::seconds ttl) {
  while (!expiry_queue_.empty() && now - expiry_queue_.front().first_seen > ttl) {
    const Expiry& oldest = expiry_queue_.front();
    const auto found = entries_.find(oldest.scoped_key);
    if (found != entries_.end() && found->second.ticket == oldest.ticket) {
      // An expired request that is still executing keeps its key until it ends;
      // stop here and try again on a later claim.
      if (found->second.executing) break;
      entries_.erase(found);
    }
    expiry_queue_.pop_front();
  }
}

IdempotencyClaim IdempotencyStore::claim(const std::string& scope,
                                         const std::string& idempotency_key,
                                         const std::string& endpoint, FormParams params,
                                         Clock::time_point now, std::chrono::seconds ttl) {
  std::sort(params.begin(), params.end());
  const std::string key = scoped_key(scope, idempotency_key);
  IdempotencyClaim claim;

  std::lock_guard<std::mutex> lock(mutex_);
  prune_expired(now, ttl);
  auto found = entries_.find(key);
  // Pruning stops at an executing entry, so a finished one behind it may be
  // expired yet still present: check this key's age directly too.
  if (found != entries_.end() && !found->second.executing && now - found->second.first_seen > ttl) {
    entries_.erase(found);
    found = entries_.end();
  }

  if (found != entries_.end()) {
    const Entry& entry = found->second;
    if (entry.executing) {
      claim.verdict = IdempotencyVerdict::in_use;
    } else if (entry.endpoint != endpoint || entry.sorted_params != params) {
      claim.verdict = IdempotencyVerdict::different_request;
      claim.first_endpoint = entry.endpoint;
    } else {
      claim.verdict = IdempotencyVerdict::replay;
      claim.saved_response = entry.response;
    }
    return claim;
  }

  Entry entry;
  entry.endpoint = endpoint;
  entry.sorted_params = std::move(params);
  entry.first_seen = now;
  entry.ticket = next_ticket_++;
  claim.verdict = IdempotencyVerdict::fresh;
  claim.ticket = entry.ticket;
  expiry_queue_.push_back(Expiry{now, key, entry.ticket});
  entries_.emplace(key, std::move(entry));
  return claim;
}

void IdempotencyStore::complete(const std::string& scope, const std::string& idempotency_key,
                                std::uint64_t ticket, ApiResponse response) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = entries_.find(scoped_key(scope, idempotency_key));
  // The entry may be gone (a reset while executing); then there is nothing to save into.
  if (found == entries_.end() || found->second.ticket != ticket) return;
  found->second.executing = false;
  found->second.response = std::move(response);
}

void IdempotencyStore::release(const std::string& scope, const std::string& idempotency_key,
                               std::uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = entries_.find(scoped_key(scope, idempotency_key));
  if (found != entries_.end() && found->second.ticket == ticket) entries_.erase(found);
}

void IdempotencyStore::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
  expiry_queue_.clear();
}

}  // namespace stripe_emulator
