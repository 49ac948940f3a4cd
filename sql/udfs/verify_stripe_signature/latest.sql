-- 22023 unless Stripe signed `payload` with the secret of
-- billguard.webhook_secret_file within the last five minutes; 55000 when
-- that setting names no usable secret (extension/stripe_webhook_signature.cpp).
CREATE OR REPLACE FUNCTION billguard.verify_stripe_signature(payload text, signature_header text)
  RETURNS void
  LANGUAGE c VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_verify_stripe_signature';
