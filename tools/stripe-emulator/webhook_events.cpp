#include "webhook_events.hpp"

#include <ctime>

#include "random_ids.hpp"

namespace stripe_emulator {

namespace {

WebhookEvent make_event(const std::string& type, const StripeObject& object) {
  WebhookEvent event;
  event.id = new_object_id("evt");
  event.type = type;
  event.object_id = object.id;
  event.connect = object.account.has_value();
  JsonWriter json;
  json.begin_object().key("id").string(event.id).key("object").string("event");
  // A connected account's event, as a Connect endpoint receives it.
  if (object.account) json.key("account").string(*object.account);
  json.key("api_version")
      .string("2024-06-20")
      .key("created")
      .integer(static_cast<std::int64_t>(std::time(nullptr)))
      .key("data")
      .begin_object()
      .key("object");
  write_api_object(json, object);
  json.end_object()
      .key("livemode")
      .boolean(false)
      .key("pending_webhooks")
      .integer(1)
      .key("request")
      .begin_object()
      .key("id")
      .null()
      .key("idempotency_key")
      .optional_string(object.idempotency_key)
      .end_object()
      .key("type")
      .string(type)
      .end_object();
  event.json = json.take();
  return event;
}

}  // namespace

StripeObject charge_of(const StripeObject& intent, const std::string& charge_id) {
  StripeObject charge = intent;
  charge.kind = ObjectKind::charge;
  charge.id = charge_id;
  charge.payment_intent = intent.id;
  charge.status = intent.status == "succeeded" ? "succeeded" : "failed";
  charge.latest_charge.reset();
  return charge;
}

std::vector<WebhookEvent> creation_events(const StripeObject& object) {
  std::vector<WebhookEvent> events;
  if (object.kind == ObjectKind::charge) {
    events.push_back(
        make_event(object.status == "succeeded" ? "charge.succeeded" : "charge.failed", object));
    return events;
  }
  events.push_back(make_event("payment_intent.created", object));
  if (object.status == "succeeded") {
    events.push_back(make_event("payment_intent.succeeded", object));
    events.push_back(make_event("charge.succeeded", charge_of(object, *object.latest_charge)));
  } else if (object.status == "requires_payment_method") {
    events.push_back(make_event("payment_intent.payment_failed", object));
    events.push_back(make_event("charge.failed", charge_of(object, new_object_id("ch"))));
  }
  return events;
}

WebhookEvent refund_event(const StripeObject& object) {
  return make_event("charge.refunded", object.kind == ObjectKind::charge
                                           ? object
                                           : charge_of(object, *object.latest_charge));
}

}  // namespace stripe_emulator
