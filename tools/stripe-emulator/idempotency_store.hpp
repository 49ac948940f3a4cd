// Stripe's idempotency layer: the first response for a key is saved once the
// endpoint starts executing and replayed for every later request with that
// key; a different request under the same key, or a concurrent one, is
// refused. Keys are scoped per API key and account (the caller's `scope`)
// and forgotten after a TTL, after which the same key is a new request (a
// second charge: what billguard must prevent).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>

#include "api_response.hpp"
#include "form_decoding.hpp"

namespace stripe_emulator {

enum class IdempotencyVerdict {
  fresh,              // first use (or the old entry expired): caller executes, then completes
  replay,             // a saved response exists: answer with it
  different_request,  // same key, other endpoint or parameters
  in_use,             // the first request with this key is still executing
};

struct IdempotencyClaim {
  IdempotencyVerdict verdict = IdempotencyVerdict::fresh;
  ApiResponse saved_response;  // for replay
  std::string first_endpoint;  // for different_request: where the key was first used
  std::uint64_t ticket = 0;    // for fresh: proves ownership to complete() and release()
};

class IdempotencyStore {
 public:
  using Clock = std::chrono::steady_clock;

  // `endpoint` is "METHOD /path"; `params` are the decoded parameters in any
  // order (they are compared as a multiset).
  IdempotencyClaim claim(const std::string& scope, const std::string& idempotency_key,
                         const std::string& endpoint, FormParams params, Clock::time_point now,
                         std::chrono::seconds ttl);

  // Saves the response of a fresh claim for replay.
  void complete(const std::string& scope, const std::string& idempotency_key, std::uint64_t ticket,
                ApiResponse response);

  // Forgets a fresh claim without saving anything (validation failures,
  // hangs), so a retry with the key is a new request.
  void release(const std::string& scope, const std::string& idempotency_key, std::uint64_t ticket);

  void clear();

 private:
  struct Entry {
    std::string endpoint;
    FormParams sorted_params;
    bool executing = true;
    ApiResponse response;
    Clock::time_point first_seen;
    std::uint64_t ticket = 0;
  };
  struct Expiry {
    Clock::time_point first_seen;
    std::string scoped_key;
    std::uint64_t ticket;
  };

  static std::string scoped_key(const std::string& scope, const std::string& idempotency_key);
  void prune_expired(Clock::time_point now, std::chrono::seconds ttl);

  std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;
  std::deque<Expiry> expiry_queue_;  // in first_seen order, for pruning without a full scan
  std::uint64_t next_ticket_ = 1;
};

}  // namespace stripe_emulator
