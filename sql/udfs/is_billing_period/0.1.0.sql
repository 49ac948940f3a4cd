-- The same period rule idempotency_key() applies (key_derivation.cpp), for
-- constraints and argument checks: one definition of a valid YYYY-MM.
CREATE FUNCTION billguard.is_billing_period(billing_period text) RETURNS boolean
  LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_is_billing_period';
