CREATE FUNCTION billguard.idempotency_key(customer_id text, billing_period text,
                                          namespace text DEFAULT billguard.key_namespace())
  RETURNS text
  LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_idempotency_key';
COMMENT ON FUNCTION billguard.idempotency_key(text, text, text) IS
  'left(sha256_hex(customer_id || '':'' || billing_period || '':'' || namespace), 32): the content-hash Stripe idempotency key.';
