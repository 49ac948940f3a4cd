-- Sleeps until a commit beyond `seen` is announced for the record's slot
-- (true) or the deadline passes (false); cancellable.
CREATE OR REPLACE FUNCTION billguard.await_terminal_commit(customer_id text, billing_period text, seen bigint,
                                                deadline timestamptz)
  RETURNS boolean
  LANGUAGE c VOLATILE STRICT
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_await_terminal_commit';
