-- The form body of a record's charge (extension/charge_request.cpp, over the
-- encoder of common/stripe_request.*); stored by the claim that first sends it.
-- A PaymentIntent says how it may be paid (automatic payment methods without
-- redirects), so it does not depend on the account's dashboard settings or
-- API version; records first sent with an older body keep it.
CREATE OR REPLACE FUNCTION billguard.charge_request_body(endpoint text, idempotency_key text,
                                              customer_id text, billing_period text,
                                              amount_cents bigint, currency text,
                                              stripe_customer text, payment_method text)
  RETURNS text
  LANGUAGE c IMMUTABLE PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_charge_request_body_v2';
