-- Why lock_attempt found nothing: 'locked' when the attempt is still the
-- record's and another session holds its row (the dispatcher records the
-- answer on a later pass; if the lease runs out first, the record is re-sent
-- with its key and Stripe replays it), else 'stale'.
CREATE OR REPLACE FUNCTION billguard.missed_attempt(key text, attempt integer)
  RETURNS text
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  RETURN CASE WHEN (SELECT r.status = 'dispatching' AND r.attempts = attempt
                      FROM billguard.billing_records r WHERE r.idempotency_key = key)
              THEN 'locked' ELSE 'stale' END;
