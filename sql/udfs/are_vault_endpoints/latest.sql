-- What a vault key may call: 1..20 Stripe API paths such as
-- /v1/payment_intents (a key for it also reaches /v1/payment_intents/<id>
-- and /v1/payment_intents/search).
CREATE OR REPLACE FUNCTION billguard.are_vault_endpoints(endpoints text[]) RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN coalesce(cardinality(endpoints) BETWEEN 1 AND 20
                  AND array_position(endpoints, NULL) IS NULL
                  AND array_to_string(endpoints, ' ') ~ '^(/v1(/[a-z_]+)+)( /v1(/[a-z_]+)+)*$', false);
