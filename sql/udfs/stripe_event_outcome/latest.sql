-- The webhook event types billguard applies, and what each says happened.
CREATE OR REPLACE FUNCTION billguard.stripe_event_outcome(event_type text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE event_type
    WHEN 'payment_intent.succeeded' THEN 'charged'
    WHEN 'charge.succeeded' THEN 'charged'
    WHEN 'payment_intent.payment_failed' THEN 'declined'
    WHEN 'charge.failed' THEN 'declined'
    WHEN 'charge.refunded' THEN 'refunded'
  END;
