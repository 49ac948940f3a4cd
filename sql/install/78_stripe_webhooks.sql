-- Stripe webhooks: Stripe's own word on the charges billguard made. A
-- delivery is verified (Stripe-Signature), applied once per Stripe event id
-- to the record its object's metadata.billguard_key names, journaled as
-- WebhookApplied and kept in stripe_events. It can settle a record billguard
-- does not know the outcome of (unknown, needs_review), and it records
-- refunds; it never turns a completed record into anything else.

\ir ../udfs/verify_stripe_signature/latest.sql

-- Every event applied, by Stripe's event id: what makes a delivery that
-- comes again (Stripe delivers at least once) change nothing. What the
-- event did to its record is `effect`:
--   completed     the record became completed with the event's charge
--   failed        an unknown or needs_review record: Stripe declined it
--   refunded      a refund of the record's charge (the record stays, or
--                 first becomes, completed; the period is not billed again)
--   confirmed     the event says what the record says already
--   unchanged     a failure while the dispatcher still has the record: it
--                 hears the same from Stripe under the same key; or a
--                 failure of an object created a day or more before the
--                 record's last attempt (Stripe may have made another since)
--   kept          the event contradicts a settled record, which keeps its
--                 status (a failure of a completed record's own charge, a
--                 decline of a cancelled or blocked one): a person should look
--   other_charge  a success or refund of another charge than the completed
--                 record's: a second charge with one key, for a person
--   mismatch      the object's amount, currency or Stripe customer differ
--                 from the record's, or the event's account (`account`;
--                 none: the platform's) is not the record's stripe_account
-- The payload itself is not kept (a PaymentIntent carries its client_secret).
CREATE TABLE billguard.stripe_events (
  event_id              text NOT NULL,
  event_type            text NOT NULL,
  object_id             text NOT NULL,  -- the PaymentIntent or Charge
  customer_id           text NOT NULL,
  billing_period        text NOT NULL,
  idempotency_key       text NOT NULL,
  effect                text NOT NULL,
  detail                text,           -- the decline, or why nothing changed
  amount_refunded_cents bigint,         -- charge.refunded: refunded so far
  stripe_created_at     timestamptz NOT NULL,
  received_at           timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT stripe_events_pk PRIMARY KEY (event_id),
  CONSTRAINT stripe_events_effect_valid CHECK (effect IN
    ('completed', 'failed', 'refunded', 'confirmed', 'unchanged', 'kept', 'other_charge', 'mismatch'))
);
COMMENT ON TABLE billguard.stripe_events IS
  'Stripe webhook events applied to billing records, once per event id, with what each did.';
CREATE INDEX stripe_events_billing ON billguard.stripe_events (customer_id, billing_period);

\ir ../udfs/stripe_event_outcome/latest.sql
\ir ../udfs/stripe_event_json/latest.sql
\ir ../udfs/stripe_event_charge_id/latest.sql
\ir ../udfs/stripe_event_decline/latest.sql
\ir ../udfs/apply_stripe_event/latest.sql
\ir ../udfs/ingest_stripe_event/latest.sql

SELECT pg_catalog.pg_extension_config_dump('billguard.stripe_events', '');
