-- Stripe's answer to attempt `attempt` of a request vault_authorize
-- reserved or reused. 2xx: settled, its answer kept for replays. 402, or
-- 400/404 of type invalid_request_error: Stripe refused this attempt; 409
-- (the key in use) and 429 (rate limited): it never executed. Either
-- releases the amount only when no other attempt of the key is in doubt;
-- otherwise the amount stays reserved until a success or vault_reconcile
-- settles it. Anything else (500, 502-504, timeouts and dropped
-- connections as upstream_status 0): the attempt's outcome is unknown, it
-- stays in doubt, and so does the reservation. Answering an attempt again
-- changes nothing, so a settle may be retried. stripe_account: the
-- connected account the request acted on, NULL for the platform's.
-- Answers settled, released or unknown.
CREATE OR REPLACE FUNCTION billguard.vault_settle(key_id text, idempotency_key text, upstream_status integer,
                                       error_type text, charge_id text, response_body text,
                                       request_id text, attempt integer, stripe_account text DEFAULT NULL)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  held    billguard.vault_reservations;
  kind    text;      -- settled, refused, not_executed or unknown
  outcome text;
  still_in_doubt integer[];
  why     text;
BEGIN
  IF upstream_status IS NULL OR upstream_status NOT BETWEEN 0 AND 599 THEN
    RAISE EXCEPTION 'upstream_status must be 0 (no answer) or an HTTP status'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  held := billguard.lock_vault_reservation(vault_settle.key_id, vault_settle.idempotency_key,
                                           vault_settle.stripe_account);
  IF vault_settle.attempt IS NULL OR vault_settle.attempt NOT BETWEEN 1 AND held.attempts THEN
    RAISE EXCEPTION 'attempt must be one of the key''s attempts, 1..%, got %', held.attempts,
                    coalesce(vault_settle.attempt::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  kind := CASE
    WHEN upstream_status BETWEEN 200 AND 299 THEN 'settled'
    WHEN upstream_status = 402 OR (upstream_status IN (400, 404)
                                   AND vault_settle.error_type = 'invalid_request_error') THEN 'refused'
    -- Stripe's rate limiters run before its idempotency layer, and a key in
    -- use is refused before the request runs: neither executed anything.
    WHEN upstream_status IN (409, 429) THEN 'not_executed'
    ELSE 'unknown'
  END;
  still_in_doubt := CASE WHEN kind = 'unknown' THEN held.attempts_in_doubt
                         ELSE array_remove(held.attempts_in_doubt, vault_settle.attempt) END;
  outcome := CASE WHEN kind = 'settled' THEN 'settled'
                  WHEN kind = 'unknown' OR still_in_doubt <> '{}' THEN 'unknown'
                  ELSE 'released' END;
  IF (outcome = 'settled' AND held.status <> 'settled') OR (outcome = 'released' AND held.status = 'reserved') THEN
    PERFORM billguard.close_vault_reservation(held, outcome, vault_settle.upstream_status,
                                              vault_settle.charge_id, vault_settle.response_body,
                                              vault_settle.request_id);
  ELSIF held.status = 'reserved' THEN
    UPDATE billguard.vault_reservations r
       SET upstream_status = vault_settle.upstream_status, attempts_in_doubt = still_in_doubt
     WHERE (r.vendor, r.billing_period, r.currency, r.stripe_account, r.idempotency_key)
         = (held.vendor, held.billing_period, held.currency, held.stripe_account, held.idempotency_key);
    IF kind <> 'unknown' THEN
      why := format('%s %s to attempt %s, but attempt %s of the key may have charged: kept reserved '
                    'until reconciled', upstream_status, coalesce(vault_settle.error_type, ''),
                    vault_settle.attempt, array_to_string(still_in_doubt, ', '));
    END IF;
  END IF;

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason, stripe_account)
  VALUES (vault_settle.key_id, held.vendor, held.billing_period, 'POST', held.endpoint, held.customer,
          held.amount_cents, held.currency, vault_settle.idempotency_key, outcome, upstream_status,
          CASE WHEN outcome = 'settled' THEN coalesce(vault_settle.charge_id, held.charge_id)
               WHEN why IS NOT NULL THEN why
               WHEN upstream_status = 0 THEN 'no answer from upstream'
               ELSE vault_settle.error_type END, nullif(held.stripe_account, ''));
  PERFORM billguard.recount_vault_budget(held, outcome);
  RETURN outcome;
END $$;
COMMENT ON FUNCTION billguard.vault_settle(text, text, integer, text, text, text, text, integer, text) IS
  'Records Stripe''s answer to one attempt of a reserved request: settled, released (no attempt can have charged) or unknown (still reserved); audited.';
