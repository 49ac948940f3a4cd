// Building Stripe requests from a billing record. Pure C++ (no PostgreSQL
// headers), so the proxy can compile the same encoding. Every attempt of a
// record must send byte-identical parameters: Stripe answers a re-used key
// with different parameters with idempotency_error.
#pragma once

#include "cpp_only.hpp"

#include <string>
#include <utility>
#include <vector>

namespace billguard {

// What a billing record says about its charge, as claimed from the queue.
struct ChargeRecord {
  std::string idempotency_key;
  std::string customer_id;
  std::string billing_period;
  long long amount_cents = 0;
  std::string currency;
  std::string stripe_customer;
  std::string payment_method;  // empty when none
};

using FormFields = std::vector<std::pair<std::string, std::string>>;

// application/x-www-form-urlencoded, fields in the given order.
std::string FormEncode(const FormFields& fields);
// Percent-encoding of one URL component (RFC 3986 unreserved kept).
std::string PercentEncode(const std::string& text);

// The charge's parameters for /v1/payment_intents or /v1/charges.
FormFields ChargeFields(const ChargeRecord& record, const std::string& endpoint);

// The search path that finds a charge by its key, e.g.
// /v1/payment_intents/search?query=metadata%5B%27billguard_key%27%5D%3A%27<key>%27
std::string SearchPath(const std::string& endpoint, const std::string& idempotency_key);

}  // namespace billguard
