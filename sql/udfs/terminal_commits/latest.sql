-- The count of announcing commits for the record's wake-up slot, read before
-- the record; NULL when billguard is not preloaded.
CREATE OR REPLACE FUNCTION billguard.terminal_commits(customer_id text, billing_period text) RETURNS bigint
  LANGUAGE c VOLATILE STRICT
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_terminal_commits';
