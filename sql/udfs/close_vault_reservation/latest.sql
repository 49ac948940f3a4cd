-- Ends a reservation's doubt: settled (a success, its answer kept to be
-- replayed) or released (no attempt of its key can have charged).
CREATE OR REPLACE FUNCTION billguard.close_vault_reservation(held billguard.vault_reservations, outcome text,
                                                  upstream_status integer, charge_id text,
                                                  response_body text, request_id text)
  RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF outcome = 'settled' THEN
    UPDATE billguard.vault_reservations r
       SET status = 'settled', upstream_status = close_vault_reservation.upstream_status,
           charge_id = close_vault_reservation.charge_id,
           response_status = close_vault_reservation.upstream_status,
           response_body = coalesce(close_vault_reservation.response_body, ''),
           response_request_id = close_vault_reservation.request_id, settled_at = now(),
           attempts_in_doubt = '{}'
     WHERE (r.vendor, r.billing_period, r.currency, r.stripe_account, r.idempotency_key)
         = (held.vendor, held.billing_period, held.currency, held.stripe_account, held.idempotency_key);
  ELSE
    UPDATE billguard.vault_reservations r
       SET status = 'released', attempts_in_doubt = '{}',
           upstream_status = coalesce(close_vault_reservation.upstream_status, r.upstream_status)
     WHERE (r.vendor, r.billing_period, r.currency, r.stripe_account, r.idempotency_key)
         = (held.vendor, held.billing_period, held.currency, held.stripe_account, held.idempotency_key);
  END IF;
END $$;
