#include "object_ledger.hpp"

namespace stripe_emulator {

void Ledger::record(StripeObject object) {
  std::lock_guard<std::mutex> lock(mutex_);
  position_by_id_[object.id] = objects_.size();
  objects_.push_back(std::move(object));
}

std::optional<StripeObject> Ledger::find(ObjectKind kind, const std::string& id,
                                         const std::optional<std::string>& account) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = position_by_id_.find(id);
  if (found == position_by_id_.end()) return std::nullopt;
  const StripeObject& object = objects_[found->second];
  if (object.kind != kind || object.account != account) return std::nullopt;
  return object;
}

std::optional<StripeObject> Ledger::modify(ObjectKind kind, const std::string& id,
                                           const std::function<void(StripeObject&)>& change) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = position_by_id_.find(id);
  if (found == position_by_id_.end() || objects_[found->second].kind != kind) return std::nullopt;
  change(objects_[found->second]);
  return objects_[found->second];
}

LedgerPage Ledger::query(const LedgerQuery& query) const {
  LedgerPage page;
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t end = objects_.size();  // scan newest to oldest from here
  if (!query.starting_after.empty()) {
    const auto cursor = position_by_id_.find(query.starting_after);
    // A cursor of another account's object names nothing this account has.
    if (cursor == position_by_id_.end() || objects_[cursor->second].account != query.account) {
      page.cursor_found = false;
      return page;
    }
    end = cursor->second;
  }
  std::size_t to_skip = query.skip;
  for (std::size_t i = end; i-- > 0;) {
    const StripeObject& object = objects_[i];
    if (object.kind != query.kind || object.account != query.account) continue;
    if (query.created_no_later_than && object.created_at > *query.created_no_later_than) continue;
    if (query.matches && !query.matches(object)) continue;
    if (to_skip > 0) {
      --to_skip;
      continue;
    }
    if (page.items.size() == query.limit) {
      page.has_more = true;
      break;
    }
    page.items.push_back(object);
  }
  return page;
}

std::vector<StripeObject> Ledger::all_in_creation_order() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return objects_;
}

void Ledger::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  objects_.clear();
  position_by_id_.clear();
}

}  // namespace stripe_emulator
