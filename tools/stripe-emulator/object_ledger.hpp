// Every object the emulator has created, in creation order. It is the ground
// truth tests compare billguard's records against ("was the card charged
// exactly once?"), and the store behind retrieve, list and search.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "stripe_objects.hpp"

namespace stripe_emulator {

struct LedgerQuery {
  ObjectKind kind = ObjectKind::payment_intent;
  std::optional<std::string> account;  // only this account's objects (nullopt: the platform's)
  std::function<bool(const StripeObject&)> matches;  // empty: every object of the kind
  // Objects created after this instant are left out (search freshness).
  std::optional<std::chrono::steady_clock::time_point> created_no_later_than;
  std::string starting_after;  // an id: the page starts just after it
  std::size_t skip = 0;        // further matches to pass over (search pages)
  std::size_t limit = 10;
};

struct LedgerPage {
  std::vector<StripeObject> items;  // newest first
  bool has_more = false;
  bool cursor_found = true;  // false when starting_after named no object
};

class Ledger {
 public:
  void record(StripeObject object);
  // The object of that kind and id made on `account` (nullopt: the platform).
  std::optional<StripeObject> find(ObjectKind kind, const std::string& id,
                                   const std::optional<std::string>& account) const;
  // Lets `change` alter the object (a refund) under the ledger's lock; the
  // object as it is afterwards, or nullopt when there is no such object.
  // Any account's (the control API acts as a person in every dashboard).
  std::optional<StripeObject> modify(ObjectKind kind, const std::string& id,
                                     const std::function<void(StripeObject&)>& change);
  LedgerPage query(const LedgerQuery& query) const;
  std::vector<StripeObject> all_in_creation_order() const;
  void clear();

 private:
  mutable std::mutex mutex_;
  std::vector<StripeObject> objects_;
  std::unordered_map<std::string, std::size_t> position_by_id_;
};

}  // namespace stripe_emulator
