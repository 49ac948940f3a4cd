-- Returns a claimed record that was never sent to the queue (the dispatcher
-- paused before sending it): the attempt does not count, and the record is
-- due again at once. A record claimed for a search goes back to 'unknown'.
CREATE OR REPLACE FUNCTION billguard.release_claim(key text, attempt integer, search boolean)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN billguard.missed_attempt(key, attempt);
  END IF;
  UPDATE billguard.billing_records r
     SET status = CASE WHEN search THEN 'unknown' ELSE 'pending' END,
         attempts = r.attempts - 1, next_attempt_at = now(), lease_expires_at = NULL,
         updated_at = now()
   WHERE r.idempotency_key = key;
  RETURN 'released';
END $$;
