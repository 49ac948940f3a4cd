-- Retention: keep the newest keep_snapshots snapshots, delete older ones
-- and every event the oldest kept snapshot covers.
CREATE OR REPLACE FUNCTION billguard.apply_retention(persistence_id text, keep_snapshots integer DEFAULT 2)
  RETURNS TABLE (snapshots_deleted bigint, events_deleted bigint)
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  pid        text := apply_retention.persistence_id;
  covered_to bigint;
BEGIN
  IF pid IS NULL THEN
    RAISE EXCEPTION 'persistence_id must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF keep_snapshots IS NULL OR keep_snapshots < 1 THEN
    RAISE EXCEPTION 'keep_snapshots must be >= 1' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT min(k.seq_nr) INTO covered_to FROM (
    SELECT s.seq_nr FROM billguard.snapshots s
     WHERE s.persistence_id = pid AND s.state_version <= billguard.state_version()
     ORDER BY s.seq_nr DESC LIMIT keep_snapshots) k;
  IF covered_to IS NULL THEN
    snapshots_deleted := 0; events_deleted := 0;
    RETURN NEXT;
    RETURN;
  END IF;
  DELETE FROM billguard.snapshots s WHERE s.persistence_id = pid AND s.seq_nr < covered_to;
  GET DIAGNOSTICS snapshots_deleted = ROW_COUNT;
  PERFORM set_config('billguard_internal.retention', 'on', true);
  -- The newest event always stays: it alone keeps the entity's highest
  -- seq_nr if every snapshot is lost later, so seq_nr never goes back.
  DELETE FROM billguard.journal j
   WHERE j.persistence_id = pid AND j.seq_nr <= covered_to
     AND j.seq_nr < (SELECT max(h.seq_nr) FROM billguard.journal h WHERE h.persistence_id = pid);
  GET DIAGNOSTICS events_deleted = ROW_COUNT;
  PERFORM set_config('billguard_internal.retention', 'off', true);
  RETURN NEXT;
END $$;
COMMENT ON FUNCTION billguard.apply_retention(text, integer) IS
  'Deletes snapshots older than the newest keep_snapshots and the events the oldest kept one covers.';
