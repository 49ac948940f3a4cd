-- Serialises the decisions on one Idempotency-Key of a budget until the
-- transaction ends: vault_authorize and vault_settle take the same lock.
CREATE OR REPLACE FUNCTION billguard.lock_vault_idempotency_key(vendor text, billing_period text,
                                                     currency text, idempotency_key text)
  RETURNS void
  LANGUAGE sql VOLATILE
  SET search_path = pg_catalog, pg_temp
  -- A class of its own for the first key: 'bg' 0x0003.
  AS $$ SELECT pg_advisory_xact_lock(1651068163, hashtext(concat_ws('/', vendor, billing_period,
                                                                    currency, idempotency_key))) $$;
