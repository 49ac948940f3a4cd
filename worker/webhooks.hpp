// POST /webhooks/stripe: Stripe's webhook deliveries, passed on unchanged
// (the raw body and the Stripe-Signature header) to
// billguard.ingest_stripe_event() in the billing database
// (--webhook-database). The signature, which the database checks with a
// secret this program never holds, authenticates a delivery: no vault key.
// A 2xx tells Stripe the event is applied or was already; anything else
// makes Stripe deliver it again later.
#pragma once

#include <string>

#include "database_pool.hpp"
#include "metrics.hpp"
#include "router.hpp"

namespace billguard::proxy {

class WebhookInbox {
 public:
  WebhookInbox(const std::string& conninfo, std::size_t pool_size);

  // Throws StartupError (secret_flags.hpp) unless the database has the
  // extension with ingest_stripe_event and the role may call it.
  void CheckSchema();

  // What ingest_stripe_event answered: the effect, already_seen or ignored.
  // Throws DatabaseUnavailable, or pqxx::sql_error for a refused delivery.
  std::string Ingest(const std::string& payload, const std::string& signature_header);

 private:
  DatabasePool pool_;
};

void RegisterWebhookEndpoint(Router& router, WebhookInbox& inbox, Metrics& metrics);

}  // namespace billguard::proxy
