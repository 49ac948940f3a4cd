-- Whether the caller's open transaction wrote this row version.
CREATE OR REPLACE FUNCTION billguard.written_by_this_transaction(row_xmin xid) RETURNS boolean
  LANGUAGE c STABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_written_by_this_transaction';
