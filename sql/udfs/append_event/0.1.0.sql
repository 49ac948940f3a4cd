CREATE FUNCTION billguard.append_event(persistence_id text, expected_seq_nr bigint,
                                       event_type text, event jsonb)
  RETURNS bigint
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  pid     text := append_event.persistence_id;
  current bigint;
  next_nr bigint;
  every   int := coalesce(current_setting('billguard.snapshot_every', true), '100')::int;
BEGIN
  IF pid IS NULL OR pid = '' THEN
    RAISE EXCEPTION 'persistence_id must not be empty' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF append_event.event_type IS NULL OR append_event.event_type = '' THEN
    RAISE EXCEPTION 'event_type must not be empty' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF append_event.event IS NULL THEN
    RAISE EXCEPTION 'event must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF expected_seq_nr IS NULL OR expected_seq_nr < 0 THEN
    RAISE EXCEPTION 'expected_seq_nr must be >= 0' USING ERRCODE = 'invalid_parameter_value';
  END IF;

  current := billguard.highest_seq_nr(pid);
  IF current <> expected_seq_nr THEN
    RAISE EXCEPTION 'concurrent append to %: expected seq_nr %, journal is at %',
                    pid, expected_seq_nr, current
      USING ERRCODE = 'serialization_failure';
  END IF;
  next_nr := expected_seq_nr + 1;
  BEGIN
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    VALUES (pid, next_nr, append_event.event ->> 'customer_id', append_event.event_type,
            append_event.event);
  EXCEPTION WHEN unique_violation THEN
    -- Another transaction appended the same seq_nr after we read the head.
    RAISE EXCEPTION 'concurrent append to %: seq_nr % was written by another transaction',
                    pid, next_nr
      USING ERRCODE = 'serialization_failure';
  END;
  IF every > 0 AND next_nr % every = 0 THEN
    PERFORM billguard.save_snapshot(pid);
  END IF;
  RETURN next_nr;
END $$;
COMMENT ON FUNCTION billguard.append_event(text, bigint, text, jsonb) IS
  'Appends one event at expected_seq_nr + 1; SQLSTATE 40001 when expected_seq_nr is stale.';
