-- How a record's status reads to a caller of bill_customer.
CREATE OR REPLACE FUNCTION billguard.caller_status(record_status text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE record_status
    WHEN 'completed' THEN 'already_completed'
    WHEN 'failed' THEN 'failed'
    WHEN 'blocked' THEN 'blocked'
    WHEN 'cancelled' THEN 'cancelled'
    WHEN 'below_minimum' THEN 'below_minimum'
    ELSE 'in_progress'   -- pending, dispatching, unknown, needs_review
  END;
