-- Advisory lock classes (first key of the two-key advisory locks) that
-- serialise claims: one per billing period, and one for the scheduler
-- entity's journal.
CREATE OR REPLACE FUNCTION billguard.period_lock_class() RETURNS integer
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN 1651068161;   -- 'bg' 0x0001
