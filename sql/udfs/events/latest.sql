CREATE OR REPLACE FUNCTION billguard.events(persistence_id text, from_seq_nr bigint DEFAULT 1,
                                 to_seq_nr bigint DEFAULT NULL, max_count bigint DEFAULT NULL)
  RETURNS TABLE (seq_nr bigint, event_type text, event jsonb, event_version integer,
                 written_at timestamptz)
  LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF events.persistence_id IS NULL THEN
    RAISE EXCEPTION 'persistence_id must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF max_count < 0 THEN
    RAISE EXCEPTION 'max_count must be >= 0, got %', max_count
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY
    SELECT j.seq_nr, j.event_type, j.event, j.event_version, j.written_at
      FROM billguard.journal j
     WHERE j.persistence_id = events.persistence_id
       AND j.seq_nr >= coalesce(from_seq_nr, 1)
       AND (to_seq_nr IS NULL OR j.seq_nr <= to_seq_nr)
     ORDER BY j.seq_nr
     LIMIT max_count;
END $$;
COMMENT ON FUNCTION billguard.events(text, bigint, bigint, bigint) IS
  'Replays an entity''s events in order, within [from_seq_nr, to_seq_nr], at most max_count.';
