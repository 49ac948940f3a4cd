-- The CREATE EXTENSION billguard running now restores a dump (the
-- ProcessUtility hook saw the session's settings; false without preloading).
CREATE OR REPLACE FUNCTION billguard.created_by_restore() RETURNS boolean
  LANGUAGE c VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_created_by_restore';
