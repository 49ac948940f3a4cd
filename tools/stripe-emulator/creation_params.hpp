// Validation of POST /v1/payment_intents and POST /v1/charges parameters.
// It runs before anything is created, and a failure is never saved for the
// idempotency key (Stripe does not save results of validation failures).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "form_decoding.hpp"
#include "stripe_error_catalog.hpp"
#include "stripe_objects.hpp"

namespace stripe_emulator {

struct CreationRequest {
  ObjectKind kind = ObjectKind::payment_intent;
  std::optional<std::string> account;  // Stripe-Account; nullopt: the platform
  std::int64_t amount = 0;
  std::string currency;
  std::optional<std::string> customer;
  std::optional<std::string> payment_source;  // payment_method or source
  bool confirm = false;
  bool off_session = false;
  std::optional<std::string> description;
  std::optional<std::int64_t> application_fee_amount;  // only on a connected account
  Metadata metadata;
  // PaymentIntents: how it may be paid (see read_payment_method_choice).
  bool automatic_payment_methods = false;
  std::optional<std::string> allow_redirects;
  std::vector<std::string> payment_method_types;
  std::optional<std::string> return_url;
};

using CreationValidation = std::variant<CreationRequest, StripeError>;

// api_version: the request's Stripe-Version, or the account's default;
// on_connected_account: the request names one in Stripe-Account.
CreationValidation validate_creation(ObjectKind kind, const FormParams& params,
                                     const std::string& api_version, bool on_connected_account);

}  // namespace stripe_emulator
