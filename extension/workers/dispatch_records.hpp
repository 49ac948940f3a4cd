// The billing records a dispatcher holds, from their claim to the recording
// of their answer, each in one named state. The transitions below are the
// only ways a record changes state; extension/workers/README.md draws them.
#pragma once

#include "common/http_client.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "workers/dispatch_queue.hpp"

namespace billguard {

enum class RecordState {
  kReady,     // claimed ('dispatching', leased): waits for its paced start or its vault key
  kInFlight,  // its request (a charge or a search) is out; the answer is awaited
  kAnswered,  // its answer came: waits to be recorded with a batch
  kDeferred,  // its row was locked when it was recorded: tried again at retry_at
};

struct HeldRecord {
  using Clock = std::chrono::steady_clock;
  RecordState state = RecordState::kReady;
  ClaimedRecord claimed;
  bool searching = false;        // the request out is, or was, a search
  bool row_lock_logged = false;  // the log said once that its row is locked
  std::string vault_key_id;      // through the proxy: the key it was sent with
  HttpResponse response;         // kAnswered and kDeferred
  Clock::time_point answered_at{};
  Clock::time_point retry_at{};  // kDeferred
};

class DispatchRecords {
 public:
  using Clock = HeldRecord::Clock;

  // Transitions. Claimed: the database's queue -> kReady.
  void Claimed(ClaimedRecord claimed);
  // Sent: the index-th of ready() -> kInFlight, its request tagged `tag`.
  // The record, for the request to be built from.
  const HeldRecord& Sent(std::size_t index, std::uint64_t tag, bool search,
                         const std::string& vault_key_id);
  // Answered: kInFlight -> kAnswered. False when no record was sent with
  // the response's tag.
  bool Answered(HttpResponse response, Clock::time_point now);
  // DeferralsDue: kDeferred -> kAnswered, those whose retry_at has come.
  void DeferralsDue(Clock::time_point now);
  // TakeAnswered: every kAnswered record, for the caller to record; each
  // then leaves the dispatcher (recorded: terminal, or due again in the
  // database; or stale: another attempt owns it) unless it is given back:
  std::vector<HeldRecord> TakeAnswered();
  //   RowLocked: kAnswered -> kDeferred until retry_at.
  void RowLocked(HeldRecord record, Clock::time_point retry_at);
  //   SearchedAbsent: a search found no charge: kAnswered -> kReady, first
  //   in line, to send the charge with the same key.
  void SearchedAbsent(HeldRecord record);
  // Released: every kReady record goes back to the database's queue (a
  // pause, a halt, an outage); the caller releases the claims.
  std::vector<ClaimedRecord> Released();
  // At a shutdown the records in every state are abandoned where they are:
  // the next dispatcher finds them 'dispatching' and re-sends them with
  // their keys (RequeueAbandoned).

  const std::deque<HeldRecord>& ready() const { return ready_; }
  std::size_t in_flight() const { return in_flight_.size(); }
  std::size_t answered() const { return answered_.size(); }
  std::size_t deferred() const { return deferred_.size(); }
  // When the oldest kAnswered record was answered (answered() > 0).
  Clock::time_point oldest_answer() const { return answered_.front().answered_at; }

 private:
  // The records of each state, in the order they entered it.
  std::deque<HeldRecord> ready_;
  std::unordered_map<std::uint64_t, HeldRecord> in_flight_;  // by request tag
  std::vector<HeldRecord> answered_;
  std::vector<HeldRecord> deferred_;
};

}  // namespace billguard
