// The dispatcher's records and their transitions (see dispatch_records.hpp).
#include "workers/dispatch_records.hpp"

#include <utility>

namespace billguard {

void DispatchRecords::Claimed(ClaimedRecord claimed) {
  HeldRecord record;
  record.claimed = std::move(claimed);
  ready_.push_back(std::move(record));
}

const HeldRecord& DispatchRecords::Sent(std::size_t index, std::uint64_t tag, bool search,
                                        const std::string& vault_key_id) {
  HeldRecord record = std::move(ready_[index]);
  ready_.erase(ready_.begin() + static_cast<std::ptrdiff_t>(index));
  record.state = RecordState::kInFlight;
  record.searching = search;
  record.row_lock_logged = false;
  record.vault_key_id = vault_key_id;
  return in_flight_.emplace(tag, std::move(record)).first->second;
}

bool DispatchRecords::Answered(HttpResponse response, Clock::time_point now) {
  auto found = in_flight_.find(response.tag);
  if (found == in_flight_.end()) return false;
  HeldRecord record = std::move(found->second);
  in_flight_.erase(found);
  record.state = RecordState::kAnswered;
  record.response = std::move(response);
  record.answered_at = now;
  answered_.push_back(std::move(record));
  return true;
}

void DispatchRecords::DeferralsDue(Clock::time_point now) {
  for (auto it = deferred_.begin(); it != deferred_.end();) {
    if (it->retry_at > now) {
      ++it;
      continue;
    }
    it->state = RecordState::kAnswered;
    it->answered_at = now;
    answered_.push_back(std::move(*it));
    it = deferred_.erase(it);
  }
}

std::vector<HeldRecord> DispatchRecords::TakeAnswered() {
  return std::exchange(answered_, {});
}

void DispatchRecords::RowLocked(HeldRecord record, Clock::time_point retry_at) {
  record.state = RecordState::kDeferred;
  record.retry_at = retry_at;
  deferred_.push_back(std::move(record));
}

void DispatchRecords::SearchedAbsent(HeldRecord record) {
  record.state = RecordState::kReady;
  record.claimed.search_first = false;
  record.response = {};
  ready_.push_front(std::move(record));
}

std::vector<ClaimedRecord> DispatchRecords::Released() {
  std::vector<ClaimedRecord> released;
  released.reserve(ready_.size());
  for (HeldRecord& record : ready_) released.push_back(std::move(record.claimed));
  ready_.clear();
  return released;
}

}  // namespace billguard
