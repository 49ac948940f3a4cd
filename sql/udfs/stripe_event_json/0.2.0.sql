-- The payload as jsonb, or 22023 naming what keeps it from being a Stripe
-- event billguard can apply; a payload that is not JSON at all raises the
-- cast's own error (ingest_stripe_event reports it as 22023). No EXCEPTION
-- block: a subtransaction would make it unsafe in a parallel query.
CREATE OR REPLACE FUNCTION billguard.stripe_event_json(payload text) RETURNS jsonb
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
