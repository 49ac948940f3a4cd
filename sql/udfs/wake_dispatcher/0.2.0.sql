CREATE OR REPLACE FUNCTION billguard.wake_dispatcher() RETURNS void
  LANGUAGE c VOLATILE PARALLEL UNSAFE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_wake_dispatcher';
COMMENT ON FUNCTION billguard.wake_dispatcher() IS
  'Wakes this database''s dispatcher when the current transaction commits (no-op unless billguard is preloaded).';
