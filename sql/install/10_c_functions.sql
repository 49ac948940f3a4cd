-- Functions implemented in C++ (extension/).
--
-- Every function of the extension pins search_path = pg_catalog, pg_temp,
-- except the six pure C ones called once per row (key_namespace,
-- idempotency_key, is_billing_period and billing_initiated_event here,
-- is_valid_customer_id, charge_request_body): they run no SQL and look no
-- name up, so a search_path cannot reach them, and the setting would triple
-- their cost (each call would save, set and restore it: idempotency_key
-- 0.26 -> 0.80 us). pgTAP 12 lists them; any other function without the
-- setting fails it.

CREATE FUNCTION billguard.key_namespace() RETURNS text
  LANGUAGE c STABLE PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_key_namespace';
COMMENT ON FUNCTION billguard.key_namespace() IS
  'The current billguard.key_namespace setting: the default namespace of idempotency_key().';

CREATE FUNCTION billguard.idempotency_key(customer_id text, billing_period text,
                                          namespace text DEFAULT billguard.key_namespace())
  RETURNS text
  LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_idempotency_key';
COMMENT ON FUNCTION billguard.idempotency_key(text, text, text) IS
  'left(sha256_hex(customer_id || '':'' || billing_period || '':'' || namespace), 32): the content-hash Stripe idempotency key.';

CREATE FUNCTION billguard.wake_dispatcher() RETURNS void
  LANGUAGE c VOLATILE PARALLEL UNSAFE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_wake_dispatcher';
COMMENT ON FUNCTION billguard.wake_dispatcher() IS
  'Wakes this database''s dispatcher when the current transaction commits (no-op unless billguard is preloaded).';

-- The same period rule idempotency_key() applies (key_derivation.cpp), for
-- constraints and argument checks: one definition of a valid YYYY-MM.
CREATE FUNCTION billguard.is_billing_period(billing_period text) RETURNS boolean
  LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_is_billing_period';

-- Raises 22023 unless billing_period is a valid YYYY-MM; the one place the
-- message is worded.
CREATE FUNCTION billguard.check_billing_period(billing_period text) RETURNS void
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF billing_period IS NULL OR NOT billguard.is_billing_period(billing_period) THEN
    RAISE EXCEPTION 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got %',
                    coalesce(quote_literal(left(billing_period, 40)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
END $$;

-- The BillingInitiated event written with every new billing record.
CREATE FUNCTION billguard.billing_initiated_event(customer_id text, billing_period text,
                                                  idempotency_key text, amount_cents bigint,
                                                  currency text, initiated_at timestamptz,
                                                  request_id text DEFAULT NULL)
  RETURNS jsonb
  LANGUAGE c STABLE PARALLEL SAFE   -- initiated_at is rendered in the session's TimeZone
  AS 'MODULE_PATHNAME', 'billguard_billing_initiated_event';
