-- Applies a verified event to its record, which the caller holds locked;
-- returns the effect (see stripe_events).
CREATE OR REPLACE FUNCTION billguard.apply_stripe_event(rec billguard.billing_records, event jsonb)
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
  -- a record's key, so what billguard sends must match too, starting with
  -- the account: a Connect endpoint's event names its connected account in
  -- `account`, the platform's own has none, and a record's charge is made
  -- on the account it froze at its first claim (NULL: the platform).
  IF event ->> 'account' IS DISTINCT FROM rec.stripe_account THEN
    effect := 'mismatch';
    detail := format('the event comes from %s, the record''s charge is made on %s',
                     coalesce('connected account ' || (event ->> 'account'), 'the platform''s own account'),
                     coalesce('connected account ' || rec.stripe_account, 'the platform''s own account'));
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
