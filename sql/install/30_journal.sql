-- The event journal: append-only, gap-free sequence numbers per entity,
-- optimistic concurrency on append.

CREATE TABLE billguard.journal (
  persistence_id text NOT NULL CHECK (persistence_id <> ''),
  seq_nr         bigint NOT NULL CHECK (seq_nr > 0),
  -- The billed customer for billing entities: the future distribution column.
  customer_id    text,
  event_type     text NOT NULL CHECK (event_type <> ''),
  event          jsonb NOT NULL,
  event_version  integer NOT NULL DEFAULT 1,
  written_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (persistence_id, seq_nr)
);
COMMENT ON TABLE billguard.journal IS
  'Append-only events; entity ids billing-<customer>-<period> and billing-scheduler.';

CREATE TABLE billguard.snapshots (
  persistence_id text NOT NULL,
  seq_nr         bigint NOT NULL CHECK (seq_nr > 0),
  state          jsonb NOT NULL,
  state_version  integer NOT NULL,
  taken_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (persistence_id, seq_nr)
);
COMMENT ON TABLE billguard.snapshots IS
  'Folded entity state every billguard.snapshot_every events; a cache, never the authority.';

-- Only the retention function may delete events, and nothing may change
-- them. apply_retention is SECURITY DEFINER, so its DELETE runs as the
-- journal's owner, a role nobody but a superuser can become: that is the
-- guard, since any session can set any setting. The transaction-local
-- setting it raises keeps the owner's own stray DELETE out too.
CREATE FUNCTION billguard.refuse_journal_change() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF TG_OP = 'DELETE' AND current_setting('billguard_internal.retention', true) = 'on'
     AND current_user = (SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = TG_RELID) THEN
    RETURN NULL;
  END IF;
  RAISE EXCEPTION 'billguard.journal is append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege',
          HINT = 'Old events are removed only by billguard.apply_retention().';
END $$;

CREATE TRIGGER journal_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON billguard.journal
  FOR EACH STATEMENT EXECUTE FUNCTION billguard.refuse_journal_change();

-- The highest sequence number ever written for an entity. Snapshots count
-- too, so it never goes back when retention deletes the events they cover.
CREATE FUNCTION billguard.highest_seq_nr(persistence_id text) RETURNS bigint
  LANGUAGE sql STABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN greatest(
    (SELECT max(j.seq_nr) FROM billguard.journal j WHERE j.persistence_id = highest_seq_nr.persistence_id),
    (SELECT max(s.seq_nr) FROM billguard.snapshots s WHERE s.persistence_id = highest_seq_nr.persistence_id),
    0);

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

CREATE FUNCTION billguard.events(persistence_id text, from_seq_nr bigint DEFAULT 1,
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
