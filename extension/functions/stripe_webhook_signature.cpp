// SQL function billguard.verify_stripe_signature(payload, signature_header):
// the first step of ingest_stripe_event(). It reads the endpoints' secrets
// from billguard.webhook_secret_file at every call and checks the
// Stripe-Signature header with common/stripe_signature.*. The secrets stay
// in this call: it is never returned, logged or stored.
#include <ctime>

#include "common/errors.hpp"
#include "common/stripe_signature.hpp"
#include "common/webhook_secret.hpp"

#include "settings/settings.hpp"
#include "postgres/sql_values.hpp"
#include "postgres/sql_function.hpp"

namespace {

// The server cannot verify anything: its configuration, not the delivery,
// is at fault, so Stripe should retry once it is fixed.
[[noreturn]] void CannotVerify(const std::string& why) {
  billguard::CallPostgres([&] {
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("Stripe webhooks cannot be verified: %s", why.c_str()),
             errhint("Set billguard.webhook_secret_file to a file holding the signing secret "
                     "(whsec_...) of each endpoint, one a line, owned by the server's user with "
                     "mode 0600, and reload.")));
  });
  pg_unreachable();
}

}  // namespace

// Raises 22023 for a delivery Stripe did not sign (no matching v1
// signature, a malformed header, a timestamp beyond five minutes), 55000
// when no usable secret is configured; returns nothing otherwise.
BILLGUARD_SQL_FUNCTION(verify_stripe_signature) {
  if (PG_ARGISNULL(1)) throw billguard::InvalidParameter("the Stripe-Signature header is missing");
  if (PG_ARGISNULL(0)) throw billguard::InvalidParameter("payload must not be NULL");
  const billguard::WebhookSecretResult loaded =
      billguard::LoadWebhookSecrets(billguard::settings::webhook_secret_file);
  if (!loaded.error.empty()) CannotVerify(loaded.error);
  billguard::VerifyStripeSignature(billguard::TextArgument(fcinfo, 0),
                                   billguard::TextArgument(fcinfo, 1), loaded.secrets,
                                   static_cast<std::int64_t>(std::time(nullptr)));
  PG_RETURN_VOID();
}
