CREATE FUNCTION billguard.save_snapshot(persistence_id text) RETURNS bigint
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  state jsonb := billguard.entity_state(save_snapshot.persistence_id);
  seq   bigint := (state ->> 'seq_nr')::bigint;
BEGIN
  IF seq = 0 THEN
    RAISE EXCEPTION 'no events for %', save_snapshot.persistence_id
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  INSERT INTO billguard.snapshots (persistence_id, seq_nr, state, state_version)
  VALUES (save_snapshot.persistence_id, seq, state - 'persistence_id' - 'seq_nr',
          billguard.state_version())
  ON CONFLICT ON CONSTRAINT snapshots_pkey DO NOTHING;
  RETURN seq;
END $$;
COMMENT ON FUNCTION billguard.save_snapshot(text) IS
  'Stores the folded state at the entity''s latest seq_nr; returns that seq_nr.';
