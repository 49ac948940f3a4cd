// The subset of Stripe's search query language that billguard uses to find
// the object a lost response created: metadata['KEY']:'VALUE' and
// customer:'cus_x', joined by AND. Anything else is refused, so a client that
// relies on more would find out here rather than against Stripe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stripe_objects.hpp"

namespace stripe_emulator {

struct SearchClause {
  enum class Field { metadata, customer };
  Field field = Field::metadata;
  std::string metadata_key;  // for Field::metadata
  std::string value;
};

// `query` is already URL-decoded. On failure returns nullopt and explains why.
std::optional<std::vector<SearchClause>> parse_search_query(std::string_view query,
                                                            std::string& error);

bool matches_all(const std::vector<SearchClause>& clauses, const StripeObject& object);

}  // namespace stripe_emulator
