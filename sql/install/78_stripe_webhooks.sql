-- Stripe webhooks: Stripe's own word on the charges billguard made. A
-- delivery is verified (Stripe-Signature), applied once per Stripe event id
-- to the record its object's metadata.billguard_key names, journaled as
-- WebhookApplied and kept in stripe_events. It can settle a record billguard
-- does not know the outcome of (unknown, needs_review), and it records
-- refunds; it never turns a completed record into anything else.

-- 22023 unless Stripe signed `payload` with the secret of
-- billguard.webhook_secret_file within the last five minutes; 55000 when
-- that setting names no usable secret (extension/stripe_webhook_signature.cpp).
CREATE FUNCTION billguard.verify_stripe_signature(payload text, signature_header text)
  RETURNS void
  LANGUAGE c VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_verify_stripe_signature';

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
--                 from the record's, or the event is a connected account's
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

-- The webhook event types billguard applies, and what each says happened.
CREATE FUNCTION billguard.stripe_event_outcome(event_type text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE event_type
    WHEN 'payment_intent.succeeded' THEN 'charged'
    WHEN 'charge.succeeded' THEN 'charged'
    WHEN 'payment_intent.payment_failed' THEN 'declined'
    WHEN 'charge.failed' THEN 'declined'
    WHEN 'charge.refunded' THEN 'refunded'
  END;

-- The payload as jsonb, or 22023 naming what keeps it from being a Stripe
-- event billguard can apply; a payload that is not JSON at all raises the
-- cast's own error (ingest_stripe_event reports it as 22023). No EXCEPTION
-- block: a subtransaction would make it unsafe in a parallel query.
CREATE FUNCTION billguard.stripe_event_json(payload text) RETURNS jsonb
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  event   jsonb := payload::jsonb;
  object  jsonb;
  problem text;
BEGIN
  object := event -> 'data' -> 'object';
  problem := CASE
    WHEN jsonb_typeof(event) IS DISTINCT FROM 'object' THEN 'it is not a JSON object'
    WHEN coalesce(event ->> 'id', '') !~ '^evt_[A-Za-z0-9_]{1,250}$' THEN 'id is not an event id (evt_...)'
    WHEN jsonb_typeof(event -> 'type') IS DISTINCT FROM 'string' THEN 'type is missing'
    WHEN jsonb_typeof(event -> 'created') IS DISTINCT FROM 'number'
      OR (event ->> 'created') !~ '^[0-9]{1,12}$' THEN 'created is not a unix time'
    WHEN jsonb_typeof(object) IS DISTINCT FROM 'object' THEN 'data.object is missing'
  END;
  IF problem IS NULL AND billguard.stripe_event_outcome(event ->> 'type') IS NOT NULL THEN
    problem := CASE
      WHEN object ->> 'object' IS DISTINCT FROM split_part(event ->> 'type', '.', 1)
        THEN format('data.object is not a %s', split_part(event ->> 'type', '.', 1))
      WHEN coalesce(object ->> 'id', '') !~ '^(pi|ch)_[A-Za-z0-9_]{1,250}$'
        THEN 'data.object.id is not a PaymentIntent or Charge id'
      WHEN jsonb_typeof(object -> 'amount') IS DISTINCT FROM 'number'
        OR (object ->> 'amount') !~ '^[0-9]{1,15}$' THEN 'data.object.amount is not an amount in cents'
      WHEN jsonb_typeof(object -> 'currency') IS DISTINCT FROM 'string' THEN 'data.object.currency is missing'
      WHEN jsonb_typeof(object -> 'metadata') IS DISTINCT FROM 'object' THEN 'data.object.metadata is missing'
      WHEN object -> 'metadata' ? 'billguard_key'
       AND coalesce(object -> 'metadata' ->> 'billguard_key', '') !~ '^[0-9a-f]{32}$'
        THEN 'data.object.metadata.billguard_key is not a billguard key'
      WHEN event ->> 'type' = 'charge.refunded'
       AND (jsonb_typeof(object -> 'amount_refunded') IS DISTINCT FROM 'number'
            OR (object ->> 'amount_refunded') !~ '^[0-9]{1,15}$')
        THEN 'data.object.amount_refunded is not an amount in cents'
    END;
  END IF;
  IF problem IS NOT NULL THEN
    RAISE EXCEPTION 'the webhook payload is not a Stripe event billguard can apply: %', problem
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN event;
END $$;

-- The charge id a record holds for the event's object: the PaymentIntent's
-- id for a record sent to /v1/payment_intents (a Charge names it in
-- payment_intent), the Charge's own id for one sent to /v1/charges.
CREATE FUNCTION billguard.stripe_event_charge_id(object jsonb) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE WHEN object ->> 'object' = 'charge'
              THEN coalesce(object ->> 'payment_intent', object ->> 'id')
              ELSE object ->> 'id' END;

-- Why Stripe declined, in one line like last_error's, e.g.
-- "card_declined/generic_decline: Your card was declined."
CREATE FUNCTION billguard.stripe_event_decline(object jsonb) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN concat_ws(': ',
    nullif(concat_ws('/', coalesce(object -> 'last_payment_error' ->> 'code', object ->> 'failure_code'),
                     object -> 'last_payment_error' ->> 'decline_code'), ''),
    coalesce(object -> 'last_payment_error' ->> 'message', object ->> 'failure_message'));

-- Applies a verified event to its record, which the caller holds locked;
-- returns the effect (see stripe_events).
CREATE FUNCTION billguard.apply_stripe_event(rec billguard.billing_records, event jsonb)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  object   jsonb := event -> 'data' -> 'object';
  outcome  text := billguard.stripe_event_outcome(event ->> 'type');
  charge   text := billguard.stripe_event_charge_id(object);
  refunded bigint := CASE WHEN outcome = 'refunded' THEN (object ->> 'amount_refunded')::bigint END;
  created  timestamptz := CASE WHEN object ->> 'created' ~ '^[0-9]{1,12}$'
                               THEN to_timestamp((object ->> 'created')::bigint) END;
  effect   text;
  detail   text;
BEGIN
  -- The key in metadata is not proof enough: anyone who can write metadata
  -- (a connected account's owner, another system on this account) can copy
  -- a record's key, so what billguard sends must match too.
  IF event ->> 'account' IS NOT NULL THEN
    effect := 'mismatch';
    detail := format('the event comes from connected account %s, not from this Stripe account',
                     event ->> 'account');
  ELSIF (object ->> 'amount')::bigint <> rec.amount_cents OR object ->> 'currency' <> rec.currency
     OR object ->> 'customer' IS DISTINCT FROM rec.stripe_customer THEN
    effect := 'mismatch';
    detail := format('the event is about %s %s of customer %s, the record about %s %s of %s',
                     object ->> 'amount', object ->> 'currency', coalesce(object ->> 'customer', 'none'),
                     rec.amount_cents, rec.currency, rec.stripe_customer);
  ELSIF outcome IN ('charged', 'refunded') AND rec.status = 'completed' THEN
    effect := CASE WHEN charge <> rec.charge_id THEN 'other_charge'
                   WHEN outcome = 'refunded' THEN 'refunded' ELSE 'confirmed' END;
    IF effect = 'other_charge' THEN
      detail := format('charge %s, while the record completed with %s', charge, rec.charge_id);
    END IF;
  ELSIF outcome IN ('charged', 'refunded') THEN
    -- Stripe charged the customer under this key: the record says so, whatever
    -- billguard believed (a cached 500, a review, a backup restored from
    -- before the charge was recorded).
    UPDATE billguard.billing_records r
       SET status = 'completed', charge_id = charge, completed_at = now(), next_attempt_at = NULL,
           lease_expires_at = NULL, last_error = NULL, updated_at = now()
     WHERE r.idempotency_key = rec.idempotency_key;
    effect := CASE WHEN outcome = 'refunded' THEN 'refunded' ELSE 'completed' END;
  ELSIF rec.status IN ('unknown', 'needs_review') AND EXISTS (
          SELECT FROM billguard.journal j
           WHERE j.persistence_id = 'billing-' || rec.customer_id || '-' || rec.billing_period
             AND j.event_type = 'ChargeAttempted'
             AND (j.event ->> 'at')::timestamptz >= created + interval '24 hours') THEN
    -- Stripe may have forgotten the key by then (after a day at the
    -- earliest) and made another PaymentIntent with it: a decline of this
    -- older object, delivered late, says nothing about that one.
    effect := 'unchanged';
    detail := format('%s was created at %s, a day or more before the record''s last attempt',
                     object ->> 'id', created);
  ELSIF rec.status IN ('unknown', 'needs_review') THEN
    detail := billguard.stripe_event_decline(object);
    UPDATE billguard.billing_records r
       SET status = 'failed', next_attempt_at = NULL, lease_expires_at = NULL, updated_at = now(),
           last_error = concat_ws(' ', 'webhook', event ->> 'type', nullif(detail, ''))
     WHERE r.idempotency_key = rec.idempotency_key;
    effect := 'failed';
  ELSIF rec.status = 'failed' THEN
    effect := 'confirmed';
  ELSIF rec.status IN ('pending', 'dispatching') THEN
    effect := 'unchanged';
  ELSE
    effect := 'kept';
    detail := format('a %s for a %s record', event ->> 'type', rec.status);
  END IF;
  IF effect IN ('kept', 'other_charge', 'mismatch') THEN
    RAISE WARNING 'billguard webhook: % (%) for %/% changed nothing: %', event ->> 'id',
                  event ->> 'type', rec.customer_id, rec.billing_period, detail
      USING HINT = 'A person should compare the record with Stripe''s dashboard.';
  END IF;

  INSERT INTO billguard.stripe_events (event_id, event_type, object_id, customer_id, billing_period,
                                       idempotency_key, effect, detail, amount_refunded_cents,
                                       stripe_created_at)
  VALUES (event ->> 'id', event ->> 'type', object ->> 'id', rec.customer_id, rec.billing_period,
          rec.idempotency_key, effect, nullif(detail, ''), refunded,
          to_timestamp((event ->> 'created')::bigint));
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'WebhookApplied',
    jsonb_strip_nulls(jsonb_build_object(
      'event_id', event ->> 'id', 'event_type', event ->> 'type', 'object_id', object ->> 'id',
      'effect', effect, 'previous_status', rec.status,
      'charge_id', CASE WHEN outcome IN ('charged', 'refunded') THEN charge END,
      'amount_refunded_cents', refunded,
      'fully_refunded', CASE WHEN outcome = 'refunded' THEN refunded >= rec.amount_cents END,
      'detail', nullif(detail, ''))));
  RETURN effect;
END $$;

-- A delivery of Stripe's webhook endpoint, as billguard-proxy passes it on
-- (POST /webhooks/stripe): the raw body and the Stripe-Signature header.
-- Returns the effect on the record (see stripe_events), 'already_seen' for
-- an event applied before, or 'ignored' for an event about something
-- billguard did not charge (another type, an object without
-- metadata.billguard_key). A bad signature, a stale timestamp or a payload
-- that is not such an event is 22023, a key no record holds P0002, a record
-- another session keeps locked for 5 s 55P03; nothing changes then.
CREATE FUNCTION billguard.ingest_stripe_event(payload text, signature_header text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  -- A session that keeps a record locked must not hold every delivery (and
  -- the proxy's connections) with it: Stripe delivers a refused one again.
  SET lock_timeout = '5s'
  AS $$
DECLARE
  event jsonb;
  key   text;
  rec   billguard.billing_records;
BEGIN
  PERFORM billguard.verify_stripe_signature(payload, signature_header);
  BEGIN
    event := billguard.stripe_event_json(payload);
  EXCEPTION WHEN invalid_text_representation OR untranslatable_character THEN
    RAISE EXCEPTION 'the webhook payload is not JSON: %', SQLERRM
      USING ERRCODE = 'invalid_parameter_value';
  END;
  key := event -> 'data' -> 'object' -> 'metadata' ->> 'billguard_key';
  IF billguard.stripe_event_outcome(event ->> 'type') IS NULL OR key IS NULL THEN
    RETURN 'ignored';
  END IF;
  -- The record's lock serialises every event of one billing, and the
  -- dispatcher's answers with them; a second delivery of the same event
  -- finds the first one's row once it holds the lock.
  BEGIN
    SELECT * INTO rec FROM billguard.billing_records r WHERE r.idempotency_key = key FOR UPDATE;
  EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'billing record % is locked by another session: event % was not applied',
                    key, event ->> 'id'
      USING ERRCODE = 'lock_not_available',
            HINT = 'Stripe delivers it again later; a transaction left open on the record holds it.';
  END;
  IF rec.idempotency_key IS NULL THEN
    RAISE EXCEPTION 'no billing record has the key % that event % names', key, event ->> 'id'
      USING ERRCODE = 'no_data_found',
            HINT = 'The event is for another database or key namespace billing through this Stripe account.';
  END IF;
  IF EXISTS (SELECT FROM billguard.stripe_events e WHERE e.event_id = event ->> 'id') THEN
    RETURN 'already_seen';
  END IF;
  RETURN billguard.apply_stripe_event(rec, event);
END $$;
COMMENT ON FUNCTION billguard.ingest_stripe_event(text, text) IS
  'Verifies a Stripe webhook delivery and applies its event once to the billing record it names.';

SELECT pg_catalog.pg_extension_config_dump('billguard.stripe_events', '');
