-- A delivery of Stripe's webhook endpoint, as billguard-proxy passes it on
-- (POST /webhooks/stripe): the raw body and the Stripe-Signature header.
-- Returns the effect on the record (see stripe_events), 'already_seen' for
-- an event applied before, or 'ignored' for an event about something
-- billguard did not charge (another type, an object without
-- metadata.billguard_key). A bad signature, a stale timestamp or a payload
-- that is not such an event is 22023, a key no record holds P0002, a record
-- another session keeps locked for 5 s 55P03; nothing changes then.
CREATE OR REPLACE FUNCTION billguard.ingest_stripe_event(payload text, signature_header text)
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
