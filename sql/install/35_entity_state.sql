-- Folding events into entity state, snapshots and retention.
-- The state is a read model for people and tools: billing_records, not a
-- snapshot, decides whether a charge may be sent.

-- The shape of the state apply_event folds; every snapshot records the
-- version it was saved with. Bumped whenever the shape changes, with a step
-- in upcast_state that brings older snapshots to it: retention deletes the
-- events a snapshot covers, so an older snapshot cannot be skipped.
--   1  0.1.0
--   2  the scheduler entity keeps last_issued_period and last_issued_at, and
--      ended_when_issued: the issued periods whose month had ended when
--      they were issued
CREATE FUNCTION billguard.state_version() RETURNS integer
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN 2;

CREATE FUNCTION billguard.initial_state(persistence_id text) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE
    WHEN persistence_id = 'billing-scheduler'
      THEN jsonb_build_object('entity', 'billing-scheduler', 'issued_periods', '[]'::jsonb,
                              'last_issued_period', NULL, 'last_issued_at', NULL,
                              'ended_when_issued', '[]'::jsonb)
    WHEN persistence_id LIKE 'billing-%'
      THEN jsonb_build_object('entity', 'billing', 'status', 'new', 'attempts', 0)
    ELSE jsonb_build_object('entity', 'unknown')
  END;

-- One step of the fold. Pure: the same events always give the same state.
CREATE FUNCTION billguard.apply_event(state jsonb, event_type text, event jsonb) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE event_type
    WHEN 'BillingInitiated' THEN state || jsonb_build_object(
      'status', 'in_progress',
      'customer_id', event -> 'customer_id',
      'billing_period', event -> 'billing_period',
      'idempotency_key', event -> 'idempotency_key',
      'amount_cents', event -> 'amount_cents',
      'currency', event -> 'currency',
      'initiated_at', event -> 'initiated_at')
    WHEN 'ChargeAttempted' THEN state || jsonb_build_object(
      'attempts', coalesce(event -> 'attempt', to_jsonb(coalesce((state ->> 'attempts')::int, 0) + 1)))
    WHEN 'BillingCompleted' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ChargeReconciled' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ReviewResolved' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'BillingFailed' THEN state || jsonb_build_object(
      'status', CASE WHEN (event ->> 'terminal')::boolean THEN 'failed' ELSE state ->> 'status' END,
      'last_error', event - 'terminal')
    WHEN 'ChargeUnknown' THEN state || jsonb_build_object('status', 'unknown')
    WHEN 'NeedsReview' THEN state || jsonb_build_object('status', 'needs_review')
    WHEN 'BillingBlocked' THEN state || jsonb_build_object('status', 'blocked')
    WHEN 'RecordRequeued' THEN state || jsonb_build_object('status', 'in_progress')
    WHEN 'BillingCancelled' THEN state || jsonb_build_object('status', 'cancelled')
    WHEN 'WebhookApplied' THEN state || jsonb_strip_nulls(jsonb_build_object(
      'status', CASE WHEN event ->> 'effect' IN ('completed', 'refunded') THEN 'completed'
                     WHEN event ->> 'effect' = 'failed' THEN 'failed' END,
      'charge_id', CASE WHEN event ->> 'effect' IN ('completed', 'refunded') THEN event -> 'charge_id' END,
      -- Stripe's amount refunded so far only grows; its events come in any order.
      'refunded_cents', CASE WHEN event ->> 'effect' = 'refunded'
                             THEN to_jsonb(greatest((state ->> 'refunded_cents')::bigint,
                                                    (event ->> 'amount_refunded_cents')::bigint)) END))
    WHEN 'BillingTickIssued' THEN jsonb_set(state, '{issued_periods}',
      CASE WHEN (state -> 'issued_periods') ? (event ->> 'billing_period')
           THEN state -> 'issued_periods'
           ELSE coalesce(state -> 'issued_periods', '[]'::jsonb) || jsonb_build_array(event -> 'billing_period')
      END)
      || CASE WHEN event ->> 'billing_period' >= coalesce(state ->> 'last_issued_period', '')
              THEN jsonb_build_object('last_issued_period', event -> 'billing_period',
                                      'last_issued_at', event -> 'issued_at')
              ELSE '{}'::jsonb
         END
      -- Events before 0.2.0 do not say: their periods count by the clock now.
      || CASE WHEN coalesce((event ->> 'month_ended')::boolean, false)
                   AND NOT coalesce(state -> 'ended_when_issued', '[]'::jsonb) ? (event ->> 'billing_period')
              THEN jsonb_build_object('ended_when_issued',
                     coalesce(state -> 'ended_when_issued', '[]'::jsonb) || jsonb_build_array(event -> 'billing_period'))
              ELSE '{}'::jsonb
         END
    ELSE state
  END || jsonb_build_object('last_event_type', event_type);

-- A snapshot's state of an older state_version in the current shape, one
-- step per version:
--   1 -> 2  the scheduler entity's last_issued_period is the greatest of its
--           issued_periods, last_issued_at unknown, ended_when_issued empty
--           (0.1.0 did not record it: those periods count by the clock now).
--           A state without issued_periods (a malformed or hand-made
--           snapshot) gets none: billing_records, not the state, keeps those
--           periods from being billed twice.
CREATE FUNCTION billguard.upcast_state(state jsonb, state_version integer) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE
    WHEN state_version >= 2 OR state ->> 'entity' IS DISTINCT FROM 'billing-scheduler' THEN state
    ELSE state || jsonb_build_object(
      'issued_periods', coalesce(state -> 'issued_periods', '[]'::jsonb),
      'last_issued_period',
        (SELECT max(p.period) FROM jsonb_array_elements_text(
           coalesce(state -> 'issued_periods', '[]'::jsonb)) AS p(period)),
      'last_issued_at', NULL,
      'ended_when_issued', '[]'::jsonb)
  END;

CREATE FUNCTION billguard.entity_state(persistence_id text) RETURNS jsonb
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

-- Retention: keep the newest keep_snapshots snapshots, delete older ones
-- and every event the oldest kept snapshot covers.
CREATE FUNCTION billguard.apply_retention(persistence_id text, keep_snapshots integer DEFAULT 2)
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
