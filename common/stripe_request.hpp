// Building Stripe requests from a billing record. Pure C++ (no PostgreSQL
// headers), so the proxy can compile the same encoding. Every attempt of a
// record must send byte-identical parameters: Stripe answers a re-used key
// with different parameters with idempotency_error.
#pragma once

#include "cpp_only.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "http_client.hpp"

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
  // What the period amount and the account add (0.3.0); empty or negative
  // when none, and then the body is exactly the one of the records before.
  std::string description;                                    // replaces billguard's own when set
  std::vector<std::pair<std::string, std::string>> metadata;  // the user's keys
  long long application_fee_cents = -1;                       // sent when >= 0
};

using FormFields = std::vector<std::pair<std::string, std::string>>;

// application/x-www-form-urlencoded, fields in the given order.
std::string FormEncode(const FormFields& fields);
// Percent-encoding of one URL component (RFC 3986 unreserved kept).
std::string PercentEncode(const std::string& text);

// The shapes of charge body billguard has sent. A record keeps the body of
// its first attempt for good (billing_records.request_body), so an older
// shape is built only to restore what a record was first sent with.
enum class ChargeForm {
  // 0.1.0: a PaymentIntent left the choice of payment methods to the
  // account's dashboard settings and API version. The upgrade from 0.1.0
  // stores this body for the records 0.1.0 had sent: never change it.
  kRelease010,
  // A PaymentIntent that says how it may be paid: see ChargeFields.
  kOffSession,
};

// The charge's parameters for /v1/payment_intents or /v1/charges; any other
// endpoint is refused (InvalidParameter).
FormFields ChargeFields(const ChargeRecord& record, const std::string& endpoint, ChargeForm form);

// The search path that finds a charge by its key, e.g.
// /v1/payment_intents/search?query=metadata%5B%27billguard_key%27%5D%3A%27<key>%27
std::string SearchPath(const std::string& endpoint, const std::string& idempotency_key);

// Where and as whom requests go: the same for every request of a process.
struct StripeAccount {
  std::string api_base;  // e.g. https://api.stripe.com, no trailing slash
  std::string api_key;
  std::string stripe_version;
  std::string user_agent;
};

// The charge of a record: POST of its stored body to its stored endpoint
// with its key. Every attempt passes the same endpoint and body.
HttpRequest ChargeRequest(const StripeAccount& account, const std::string& endpoint,
                          const std::string& body, const std::string& idempotency_key,
                          std::uint64_t tag);
// The search for a record's charge at the endpoint its charge was sent to.
HttpRequest SearchRequest(const StripeAccount& account, const std::string& endpoint,
                          const std::string& idempotency_key, std::uint64_t tag);

}  // namespace billguard
