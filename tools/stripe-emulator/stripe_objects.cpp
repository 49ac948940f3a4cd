#include "stripe_objects.hpp"

namespace stripe_emulator {

namespace {

void write_metadata(JsonWriter& json, const Metadata& metadata) {
  json.begin_object();
  for (const auto& [name, value] : metadata) json.key(name).string(value);
  json.end_object();
}

// Stripe's automatic_payment_methods (null when off) and payment_method_types.
void write_payment_method_choice(JsonWriter& json, const StripeObject& intent) {
  json.key("automatic_payment_methods");
  if (intent.automatic_payment_methods) {
    json.begin_object()
        .key("allow_redirects")
        .string(intent.allow_redirects.value_or("always"))
        .key("enabled")
        .boolean(true)
        .end_object();
  } else {
    json.null();
  }
  json.key("payment_method_types").begin_array();
  for (const std::string& type : intent.payment_method_types) json.string(type);
  json.end_array();
}

void write_payment_intent(JsonWriter& json, const StripeObject& intent) {
  const bool succeeded = intent.status == "succeeded";
  json.begin_object()
      .key("id")
      .string(intent.id)
      .key("object")
      .string("payment_intent")
      .key("amount")
      .integer(intent.amount)
      .key("amount_received")
      .integer(succeeded ? intent.amount : 0)
      .key("application_fee_amount")
      .optional_integer(intent.application_fee_amount);
  write_payment_method_choice(json, intent);
  json.key("capture_method")
      .string("automatic")
      .key("confirmation_method")
      .string("automatic")
      .key("created")
      .integer(intent.created_unix)
      .key("currency")
      .string(intent.currency)
      .key("customer")
      .optional_string(intent.customer)
      .key("description")
      .optional_string(intent.description)
      .key("latest_charge")
      .optional_string(intent.latest_charge)
      .key("livemode")
      .boolean(false)
      .key("metadata");
  write_metadata(json, intent.metadata);
  json.key("payment_method").optional_string(intent.payment_source);
  if (intent.failure_code) {
    json.key("last_payment_error")
        .begin_object()
        .key("type")
        .string("card_error")
        .key("code")
        .string(*intent.failure_code)
        .key("decline_code")
        .optional_string(intent.decline_code)
        .key("message")
        .optional_string(intent.failure_message)
        .end_object();
  }
  json.key("status").string(intent.status).end_object();
}

void write_charge(JsonWriter& json, const StripeObject& charge) {
  const bool paid = charge.status == "succeeded";
  json.begin_object()
      .key("id")
      .string(charge.id)
      .key("object")
      .string("charge")
      .key("amount")
      .integer(charge.amount)
      .key("amount_captured")
      .integer(paid ? charge.amount : 0)
      .key("amount_refunded")
      .integer(charge.amount_refunded)
      .key("application_fee_amount")
      .optional_integer(charge.application_fee_amount)
      .key("captured")
      .boolean(paid)
      .key("created")
      .integer(charge.created_unix)
      .key("currency")
      .string(charge.currency)
      .key("customer")
      .optional_string(charge.customer)
      .key("description")
      .optional_string(charge.description)
      .key("failure_code")
      .optional_string(charge.failure_code)
      .key("failure_message")
      .optional_string(charge.failure_message)
      .key("livemode")
      .boolean(false)
      .key("metadata");
  write_metadata(json, charge.metadata);
  json.key("paid")
      .boolean(paid)
      .key("payment_intent")
      .optional_string(charge.payment_intent)
      .key("payment_method")
      .optional_string(charge.payment_source)
      .key("refunded")
      .boolean(paid && charge.amount_refunded >= charge.amount)
      .key("status")
      .string(charge.status)
      .end_object();
}

}  // namespace

const char* object_type_name(ObjectKind kind) {
  return kind == ObjectKind::payment_intent ? "payment_intent" : "charge";
}

void write_api_object(JsonWriter& json, const StripeObject& object) {
  if (object.kind == ObjectKind::payment_intent) {
    write_payment_intent(json, object);
  } else {
    write_charge(json, object);
  }
}

std::string render_api_object(const StripeObject& object) {
  JsonWriter json;
  write_api_object(json, object);
  return json.take();
}

void write_ledger_entry(JsonWriter& json, const StripeObject& object) {
  json.begin_object()
      .key("id")
      .string(object.id)
      .key("object")
      .string(object_type_name(object.kind))
      .key("account")
      .optional_string(object.account)
      .key("amount")
      .integer(object.amount)
      .key("application_fee_amount")
      .optional_integer(object.application_fee_amount)
      .key("currency")
      .string(object.currency)
      .key("customer")
      .optional_string(object.customer)
      .key("status")
      .string(object.status)
      .key("metadata");
  write_metadata(json, object.metadata);
  json.key("created")
      .integer(object.created_unix)
      .key("idempotency_key")
      .optional_string(object.idempotency_key);
  if (object.kind == ObjectKind::payment_intent) write_payment_method_choice(json, object);
  json.end_object();
}

}  // namespace stripe_emulator
