CREATE OR REPLACE FUNCTION billguard.scheduler_lock_class() RETURNS integer
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN 1651068162;   -- 'bg' 0x0002
