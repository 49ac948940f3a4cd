-- At dispatcher start: rows a previous dispatcher left 'dispatching' are due
-- now, to be re-sent with their stored key. They are in the dispatch queue,
-- which the scan reads instead of the whole table.
CREATE OR REPLACE FUNCTION billguard.requeue_abandoned() RETURNS bigint
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  AS $$
  WITH requeued AS (
    UPDATE billguard.billing_records
       SET next_attempt_at = now(), lease_expires_at = NULL, updated_at = now()
     WHERE status = 'dispatching' AND next_attempt_at IS NOT NULL
    RETURNING 1)
  SELECT count(*) FROM requeued;
$$;
