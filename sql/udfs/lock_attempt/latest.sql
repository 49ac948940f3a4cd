-- The record of one dispatch attempt, locked, or NULL when the record has
-- moved on (its lease was taken over, an operator requeued it: a late
-- answer to an old attempt must not overwrite a newer state) or when another
-- session holds its row lock: the dispatcher never waits for a row, so one
-- held lock cannot halt all billing (see missed_attempt). The row is found
-- by its primary key alone, the one plan whatever the statistics say.
CREATE OR REPLACE FUNCTION billguard.lock_attempt(key text, attempt integer)
  RETURNS billguard.billing_records
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  SELECT * INTO rec FROM billguard.billing_records r WHERE r.idempotency_key = key
     FOR UPDATE SKIP LOCKED;
  IF rec.status IS DISTINCT FROM 'dispatching' OR rec.attempts IS DISTINCT FROM attempt THEN
    RETURN NULL;
  END IF;
  RETURN rec;
END $$;
