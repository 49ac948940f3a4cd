-- The shape of the state apply_event folds; every snapshot records the
-- version it was saved with. Bumped whenever the shape changes, with a step
-- in upcast_state that brings older snapshots to it: retention deletes the
-- events a snapshot covers, so an older snapshot cannot be skipped.
--   1  0.1.0
--   2  the scheduler entity keeps last_issued_period and last_issued_at, and
--      ended_when_issued: the issued periods whose month had ended when
--      they were issued
CREATE OR REPLACE FUNCTION billguard.state_version() RETURNS integer
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN 2;
