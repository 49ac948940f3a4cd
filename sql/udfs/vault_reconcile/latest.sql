-- What the proxy found at Stripe about a reservation still reserved past
-- the idempotency window, or whose attempts are in doubt long after the
-- last one: found (a charged object the key created: settled with that
-- object as its answer, which is then replayed), absent (Stripe holds no
-- charge of the key: released, so a retry is counted again from scratch)
-- or uncertain (neither can be proved: nothing changes, the reason is
-- audited). attempts is the reservation's attempt count when the lookup
-- began: an absence seen before a newer attempt proves nothing about it,
-- and is answered stale. stripe_account: the connected account the request
-- acted on, NULL for the platform's. Answers settled, released, unknown or
-- stale.
CREATE OR REPLACE FUNCTION billguard.vault_reconcile(key_id text, idempotency_key text, attempts integer,
                                          finding text, charge_id text, response_body text,
                                          request_id text, reason text, stripe_account text DEFAULT NULL)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  held    billguard.vault_reservations;
  outcome text;
BEGIN
  IF finding IS NULL OR finding NOT IN ('found', 'absent', 'uncertain') THEN
    RAISE EXCEPTION 'finding must be found, absent or uncertain, got %', coalesce(quote_literal(finding), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF finding = 'found' AND (vault_reconcile.charge_id IS NULL OR vault_reconcile.response_body IS NULL) THEN
    RAISE EXCEPTION 'a charge found needs its id and its object' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  held := billguard.lock_vault_reservation(vault_reconcile.key_id, vault_reconcile.idempotency_key,
                                           vault_reconcile.stripe_account);
  outcome := CASE
    -- A charge found is a fact, whatever happened since.
    WHEN finding = 'found' THEN 'settled'
    WHEN held.status <> 'reserved' OR held.attempts IS DISTINCT FROM vault_reconcile.attempts THEN 'stale'
    WHEN finding = 'absent' THEN 'released'
    ELSE 'unknown'
  END;
  IF outcome = 'stale' OR (outcome = 'settled' AND held.status = 'settled') THEN
    RETURN outcome;
  END IF;
  IF outcome <> 'unknown' THEN
    PERFORM billguard.close_vault_reservation(held, outcome, CASE WHEN outcome = 'settled' THEN 200 END,
                                              vault_reconcile.charge_id, vault_reconcile.response_body,
                                              vault_reconcile.request_id);
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason, stripe_account)
  VALUES (vault_reconcile.key_id, held.vendor, held.billing_period, 'POST', held.endpoint, held.customer,
          held.amount_cents, held.currency, vault_reconcile.idempotency_key, outcome, NULL,
          left('reconciled with Stripe: ' || coalesce(vault_reconcile.reason, finding), 1000),
          nullif(held.stripe_account, ''));
  PERFORM billguard.recount_vault_budget(held, outcome);
  RETURN outcome;
END $$;
COMMENT ON FUNCTION billguard.vault_reconcile(text, text, integer, text, text, text, text, text, text) IS
  'Settles or releases a reserved request from what the proxy found at Stripe; audited.';
