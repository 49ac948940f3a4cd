-- Refusal bodies as Stripe shapes its errors, so every Stripe client
-- surfaces them as Stripe errors.
CREATE OR REPLACE FUNCTION billguard.stripe_error_body(error_type text, code text, message text) RETURNS text
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN jsonb_build_object('error', jsonb_strip_nulls(jsonb_build_object(
           'type', error_type, 'code', code, 'message', message)))::text;
