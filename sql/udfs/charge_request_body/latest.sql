-- The form body of a record's charge (extension/functions/charge_request.cpp,
-- over the encoder of common/stripe_request.*); stored by the claim that
-- first sends it. A PaymentIntent says how it may be paid (automatic payment
-- methods without redirects), so it does not depend on the account's
-- dashboard settings or API version. description replaces billguard's own,
-- metadata's keys follow billguard's three (a user key of the same name is
-- left out), application_fee_cents is sent as application_fee_amount; with
-- none of them the body is 0.2.0's, byte for byte. Records first sent with
-- an older body keep it.
CREATE OR REPLACE FUNCTION billguard.charge_request_body(endpoint text, idempotency_key text,
                                              customer_id text, billing_period text,
                                              amount_cents bigint, currency text,
                                              stripe_customer text, payment_method text,
                                              description text DEFAULT NULL,
                                              metadata jsonb DEFAULT NULL,
                                              application_fee_cents bigint DEFAULT NULL)
  RETURNS text
  LANGUAGE c IMMUTABLE PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_charge_request_body_v3';
