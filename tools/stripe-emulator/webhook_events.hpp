// The events Stripe sends to webhook endpoints about the objects the
// emulator creates, as Stripe renders them: {"id": "evt_...", "object":
// "event", "type", "created", "data": {"object": ...}, ...}.
//   PaymentIntent  payment_intent.created, then payment_intent.succeeded and
//                  charge.succeeded, or payment_intent.payment_failed and
//                  charge.failed (a confirmation that charged or was declined)
//   Charge         charge.succeeded or charge.failed
//   refund         charge.refunded
// A PaymentIntent's charge carries the PaymentIntent's metadata and names it
// in payment_intent, as Stripe copies them when it confirms.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "stripe_objects.hpp"

namespace stripe_emulator {

struct WebhookEvent {
  std::string id;
  std::string type;
  std::string object_id;
  bool connect = false;  // a connected account's: for a Connect endpoint
  std::string json;      // the body of every delivery of it
};

std::vector<WebhookEvent> creation_events(const StripeObject& object);

// charge.refunded for a Charge, or for a PaymentIntent's charge, as it is
// after the refund.
WebhookEvent refund_event(const StripeObject& object);

// The Charge a PaymentIntent made when it was confirmed.
StripeObject charge_of(const StripeObject& intent, const std::string& charge_id);

}  // namespace stripe_emulator
