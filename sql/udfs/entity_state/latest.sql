CREATE OR REPLACE FUNCTION billguard.entity_state(persistence_id text) RETURNS jsonb
  LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  pid    text := entity_state.persistence_id;
  state  jsonb;
  seq    bigint := 0;
  ev     record;
BEGIN
  IF pid IS NULL THEN
    RAISE EXCEPTION 'persistence_id must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT billguard.upcast_state(s.state, s.state_version), s.seq_nr INTO state, seq
    FROM billguard.snapshots s
   WHERE s.persistence_id = pid AND s.state_version <= billguard.state_version()
   ORDER BY s.seq_nr DESC LIMIT 1;
  IF NOT FOUND THEN
    state := billguard.initial_state(pid);
    seq := 0;
  END IF;
  FOR ev IN SELECT j.seq_nr, j.event_type, j.event FROM billguard.journal j
             WHERE j.persistence_id = pid AND j.seq_nr > seq ORDER BY j.seq_nr LOOP
    state := billguard.apply_event(state, ev.event_type, ev.event);
    seq := ev.seq_nr;
  END LOOP;
  RETURN state || jsonb_build_object('persistence_id', pid, 'seq_nr', seq);
END $$;
COMMENT ON FUNCTION billguard.entity_state(text) IS
  'Folded state of an entity: its latest snapshot, upcast to the current state_version, plus the events after it.';
