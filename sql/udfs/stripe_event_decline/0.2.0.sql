-- Why Stripe declined, in one line like last_error's, e.g.
-- "card_declined/generic_decline: Your card was declined."
CREATE OR REPLACE FUNCTION billguard.stripe_event_decline(object jsonb) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN concat_ws(': ',
    nullif(concat_ws('/', coalesce(object -> 'last_payment_error' ->> 'code', object ->> 'failure_code'),
                     object -> 'last_payment_error' ->> 'decline_code'), ''),
    coalesce(object -> 'last_payment_error' ->> 'message', object ->> 'failure_message'));
