-- The charge id a record holds for the event's object: the PaymentIntent's
-- id for a record sent to /v1/payment_intents (a Charge names it in
-- payment_intent), the Charge's own id for one sent to /v1/charges.
CREATE OR REPLACE FUNCTION billguard.stripe_event_charge_id(object jsonb) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE WHEN object ->> 'object' = 'charge'
              THEN coalesce(object ->> 'payment_intent', object ->> 'id')
              ELSE object ->> 'id' END;
