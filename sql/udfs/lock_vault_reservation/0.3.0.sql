-- The reservation of an Idempotency-Key in the budget a vault key spends,
-- with the key's lock taken (as vault_authorize takes it; the budget's row
-- lock, when its committed sum changes at all, comes last): what
-- vault_settle and vault_reconcile decide on. stripe_account: the account
-- the request acted on, NULL for the platform's. P0002 when there is none.
CREATE OR REPLACE FUNCTION billguard.lock_vault_reservation(key_id text, idempotency_key text,
                                                 stripe_account text)
  RETURNS billguard.vault_reservations
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  k    billguard.vault_keys;
  held billguard.vault_reservations;
BEGIN
  SELECT * INTO k FROM billguard.vault_keys v WHERE v.key_id = lock_vault_reservation.key_id;
  PERFORM billguard.lock_vault_idempotency_key(k.vendor, k.billing_period, k.currency,
                                               lock_vault_reservation.idempotency_key);
  SELECT * INTO held FROM billguard.vault_reservations r
   WHERE (r.vendor, r.billing_period, r.currency, r.stripe_account, r.idempotency_key)
       = (k.vendor, k.billing_period, k.currency, coalesce(lock_vault_reservation.stripe_account, ''),
          lock_vault_reservation.idempotency_key);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no reservation of vault key % for Idempotency-Key %',
                    coalesce(quote_literal(left(lock_vault_reservation.key_id, 40)), 'NULL'),
                    coalesce(quote_literal(left(lock_vault_reservation.idempotency_key, 255)), 'NULL')
                    || coalesce(' on ' || left(lock_vault_reservation.stripe_account, 255), '')
      USING ERRCODE = 'no_data_found';
  END IF;
  RETURN held;
END $$;
