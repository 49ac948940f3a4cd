-- The statuses a record leaves only by a person's decision (retry_record,
-- resolve_record, cancel_record of a below_minimum one): what await_billing
-- waits for.
CREATE OR REPLACE FUNCTION billguard.is_terminal_status(status text) RETURNS boolean
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN status IN ('completed', 'failed', 'blocked', 'needs_review', 'cancelled', 'below_minimum');
