// The two kinds of object billguard creates (PaymentIntents and Charges), and
// their JSON: the API representation and the control API's ledger entry.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "json.hpp"

namespace stripe_emulator {

enum class ObjectKind { payment_intent, charge };

// The value of the "object" field: "payment_intent" or "charge".
const char* object_type_name(ObjectKind kind);

// Sorted by key, one value per key: what Stripe returns whatever order was sent.
using Metadata = std::map<std::string, std::string>;

struct StripeObject {
  ObjectKind kind = ObjectKind::payment_intent;
  std::string id;
  // The connected account it was made on (Stripe-Account); nullopt: the
  // platform's own. Only requests for the same account see it.
  std::optional<std::string> account;
  std::int64_t amount = 0;
  std::string currency;
  std::optional<std::string> customer;
  std::optional<std::string> payment_source;  // payment_method (PaymentIntent) or source (Charge)
  std::string status;
  std::optional<std::string> description;
  std::optional<std::int64_t> application_fee_amount;
  Metadata metadata;
  std::int64_t created_unix = 0;
  // Monotonic creation instant: decides when search may see the object.
  std::chrono::steady_clock::time_point created_at;
  std::optional<std::string> idempotency_key;
  std::optional<std::string> latest_charge;  // PaymentIntent: set when it succeeded
  std::optional<std::string> failure_code;   // set when it was declined
  std::optional<std::string> failure_message;
  std::optional<std::string> decline_code;    // PaymentIntent: its last_payment_error's
  std::optional<std::string> payment_intent;  // Charge: the PaymentIntent that made it
  std::int64_t amount_refunded = 0;           // refunded so far (the PaymentIntent's charge)
  // PaymentIntent: how it may be paid, as created.
  bool automatic_payment_methods = false;
  std::optional<std::string> allow_redirects;
  std::vector<std::string> payment_method_types;
};

void write_api_object(JsonWriter& json, const StripeObject& object);
std::string render_api_object(const StripeObject& object);

void write_ledger_entry(JsonWriter& json, const StripeObject& object);

}  // namespace stripe_emulator
