-- billguard 0.1.0 install script, assembled from sql/install/*.sql in name order.
\echo Use "CREATE EXTENSION billguard" to load this file. \quit
-- Functions implemented in C++ (extension/).

CREATE FUNCTION billguard.key_namespace() RETURNS text
  LANGUAGE c STABLE PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_key_namespace';
COMMENT ON FUNCTION billguard.key_namespace() IS
  'The current billguard.key_namespace setting: the default namespace of idempotency_key().';

CREATE FUNCTION billguard.idempotency_key(customer_id text, billing_period text,
                                          namespace text DEFAULT billguard.key_namespace())
  RETURNS text
  LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_idempotency_key';
COMMENT ON FUNCTION billguard.idempotency_key(text, text, text) IS
  'left(sha256_hex(customer_id || '':'' || billing_period || '':'' || namespace), 32): the content-hash Stripe idempotency key.';

CREATE FUNCTION billguard.wake_dispatcher() RETURNS void
  LANGUAGE c VOLATILE PARALLEL UNSAFE
  AS 'MODULE_PATHNAME', 'billguard_wake_dispatcher';
COMMENT ON FUNCTION billguard.wake_dispatcher() IS
  'Wakes the dispatcher when the current transaction commits (no-op unless billguard is preloaded).';

-- The same period rule idempotency_key() applies (key_derivation.cpp), for
-- constraints and argument checks: one definition of a valid YYYY-MM.
CREATE FUNCTION billguard.is_billing_period(billing_period text) RETURNS boolean
  LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_is_billing_period';

-- Raises 22023 unless billing_period is a valid YYYY-MM; the one place the
-- message is worded.
CREATE FUNCTION billguard.check_billing_period(billing_period text) RETURNS void
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
  IF billing_period IS NULL OR NOT billguard.is_billing_period(billing_period) THEN
    RAISE EXCEPTION 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got %',
                    coalesce(quote_literal(left(billing_period, 40)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
END $$;

-- The BillingInitiated event written with every new billing record.
CREATE FUNCTION billguard.billing_initiated_event(customer_id text, billing_period text,
                                                  idempotency_key text, amount_cents bigint,
                                                  currency text, initiated_at timestamptz,
                                                  request_id text DEFAULT NULL)
  RETURNS jsonb
  LANGUAGE c STABLE PARALLEL SAFE   -- initiated_at is rendered in the session's TimeZone
  AS 'MODULE_PATHNAME', 'billguard_billing_initiated_event';
-- Who is billed each period, and the currencies they may be billed in.

-- ISO 4217 active codes, lower case as Stripe writes them, with their minor
-- units (amount_cents counts these).
CREATE TABLE billguard.currencies (
  code        text PRIMARY KEY CHECK (code ~ '^[a-z]{3}$'),
  minor_units smallint NOT NULL CHECK (minor_units BETWEEN 0 AND 3)
);
INSERT INTO billguard.currencies (code, minor_units) VALUES
  ('aed', 2), ('afn', 2), ('all', 2), ('amd', 2), ('ang', 2), ('aoa', 2), ('ars', 2), ('aud', 2),
  ('awg', 2), ('azn', 2), ('bam', 2), ('bbd', 2), ('bdt', 2), ('bgn', 2), ('bhd', 3), ('bif', 0),
  ('bmd', 2), ('bnd', 2), ('bob', 2), ('brl', 2), ('bsd', 2), ('btn', 2), ('bwp', 2), ('byn', 2),
  ('bzd', 2), ('cad', 2), ('cdf', 2), ('chf', 2), ('clp', 0), ('cny', 2), ('cop', 2), ('crc', 2),
  ('cup', 2), ('cve', 2), ('czk', 2), ('djf', 0), ('dkk', 2), ('dop', 2), ('dzd', 2), ('egp', 2),
  ('ern', 2), ('etb', 2), ('eur', 2), ('fjd', 2), ('fkp', 2), ('gbp', 2), ('gel', 2), ('ghs', 2),
  ('gip', 2), ('gmd', 2), ('gnf', 0), ('gtq', 2), ('gyd', 2), ('hkd', 2), ('hnl', 2), ('htg', 2),
  ('huf', 2), ('idr', 2), ('ils', 2), ('inr', 2), ('iqd', 3), ('irr', 2), ('isk', 0), ('jmd', 2),
  ('jod', 3), ('jpy', 0), ('kes', 2), ('kgs', 2), ('khr', 2), ('kmf', 0), ('kpw', 2), ('krw', 0),
  ('kwd', 3), ('kyd', 2), ('kzt', 2), ('lak', 2), ('lbp', 2), ('lkr', 2), ('lrd', 2), ('lsl', 2),
  ('lyd', 3), ('mad', 2), ('mdl', 2), ('mga', 2), ('mkd', 2), ('mmk', 2), ('mnt', 2), ('mop', 2),
  ('mru', 2), ('mur', 2), ('mvr', 2), ('mwk', 2), ('mxn', 2), ('myr', 2), ('mzn', 2), ('nad', 2),
  ('ngn', 2), ('nio', 2), ('nok', 2), ('npr', 2), ('nzd', 2), ('omr', 3), ('pab', 2), ('pen', 2),
  ('pgk', 2), ('php', 2), ('pkr', 2), ('pln', 2), ('pyg', 0), ('qar', 2), ('ron', 2), ('rsd', 2),
  ('rub', 2), ('rwf', 0), ('sar', 2), ('sbd', 2), ('scr', 2), ('sdg', 2), ('sek', 2), ('sgd', 2),
  ('shp', 2), ('sle', 2), ('sll', 2), ('sos', 2), ('srd', 2), ('ssp', 2), ('stn', 2), ('svc', 2),
  ('syp', 2), ('szl', 2), ('thb', 2), ('tjs', 2), ('tmt', 2), ('tnd', 3), ('top', 2), ('try', 2),
  ('ttd', 2), ('twd', 2), ('tzs', 2), ('uah', 2), ('ugx', 0), ('usd', 2), ('uyu', 2), ('uzs', 2),
  ('ves', 2), ('vnd', 0), ('vuv', 0), ('wst', 2), ('xaf', 0), ('xcd', 2), ('xcg', 2), ('xof', 0),
  ('xpf', 0), ('yer', 2), ('zar', 2), ('zmw', 2), ('zwg', 2), ('zwl', 2);

CREATE TABLE billguard.accounts (
  customer_id     text PRIMARY KEY,
  stripe_customer text NOT NULL,
  amount_cents    bigint NOT NULL,
  currency        text NOT NULL DEFAULT 'usd' REFERENCES billguard.currencies (code),
  payment_method  text,
  active          boolean NOT NULL DEFAULT true,
  created_at      timestamptz NOT NULL DEFAULT now(),
  updated_at      timestamptz NOT NULL DEFAULT now(),
  -- Same limits as idempotency_key(): 1..255 bytes, no control characters,
  -- no surrounding blanks (' cust_1' and 'cust_1' would be two customers).
  CONSTRAINT accounts_customer_id_valid CHECK (
    octet_length(customer_id) BETWEEN 1 AND 255
    AND customer_id = btrim(customer_id) AND customer_id !~ '[[:cntrl:]]'),
  CONSTRAINT accounts_stripe_customer_valid CHECK (stripe_customer ~ '^cus_[A-Za-z0-9_]{1,250}$'),
  CONSTRAINT accounts_amount_positive CHECK (amount_cents > 0),
  CONSTRAINT accounts_payment_method_valid CHECK (payment_method ~ '^[a-z]+_[A-Za-z0-9_]{1,250}$')
);
COMMENT ON TABLE billguard.accounts IS 'Who is billed each period: one row per customer, billed amount_cents in currency.';
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
-- them. It announces itself with a transaction-local setting.
CREATE FUNCTION billguard.refuse_journal_change() RETURNS trigger
  LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' AND current_setting('billguard_internal.retention', true) = 'on' THEN
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
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
-- Folding events into entity state, snapshots and retention.
-- The state is a read model for people and tools: billing_records, not a
-- snapshot, decides whether a charge may be sent.

-- Bumped whenever apply_event's state shape changes; older snapshots are
-- then ignored and the state is folded from the journal.
CREATE FUNCTION billguard.state_version() RETURNS integer
  LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 1;

CREATE FUNCTION billguard.initial_state(persistence_id text) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  RETURN CASE
    WHEN persistence_id = 'billing-scheduler'
      THEN jsonb_build_object('entity', 'billing-scheduler', 'issued_periods', '[]'::jsonb)
    WHEN persistence_id LIKE 'billing-%'
      THEN jsonb_build_object('entity', 'billing', 'status', 'new', 'attempts', 0)
    ELSE jsonb_build_object('entity', 'unknown')
  END;

-- One step of the fold. Pure: the same events always give the same state.
CREATE FUNCTION billguard.apply_event(state jsonb, event_type text, event jsonb) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
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
    WHEN 'BillingTickIssued' THEN jsonb_set(state, '{issued_periods}',
      CASE WHEN (state -> 'issued_periods') ? (event ->> 'billing_period')
           THEN state -> 'issued_periods'
           ELSE coalesce(state -> 'issued_periods', '[]'::jsonb) || jsonb_build_array(event -> 'billing_period')
      END)
    ELSE state
  END || jsonb_build_object('last_event_type', event_type);

CREATE FUNCTION billguard.entity_state(persistence_id text) RETURNS jsonb
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  pid    text := entity_state.persistence_id;
  state  jsonb;
  seq    bigint := 0;
  ev     record;
BEGIN
  IF pid IS NULL THEN
    RAISE EXCEPTION 'persistence_id must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT s.state, s.seq_nr INTO state, seq
    FROM billguard.snapshots s
   WHERE s.persistence_id = pid AND s.state_version = billguard.state_version()
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
  'Folded state of an entity: its latest snapshot plus the events after it.';

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
     WHERE s.persistence_id = pid AND s.state_version = billguard.state_version()
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
-- The pre-flight table: one row per (customer, period), claimed before any
-- call to Stripe. It is the authority on whether a charge may be sent.

CREATE TABLE billguard.billing_records (
  -- The seed's columns and constraints, verbatim.
  customer_id      TEXT NOT NULL,
  billing_period   TEXT NOT NULL,
  idempotency_key  TEXT NOT NULL,
  status           TEXT NOT NULL DEFAULT 'pending',
  charge_id        TEXT,
  created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
  -- What dispatch needs, frozen at claim time so every retry sends
  -- byte-identical parameters.
  amount_cents        bigint NOT NULL,
  currency            text NOT NULL,
  stripe_customer     text NOT NULL,
  payment_method      text,
  request_id          text,            -- tracing only; never part of a key
  attempts            integer NOT NULL DEFAULT 0,
  next_attempt_at     timestamptz NOT NULL DEFAULT now(),
  lease_expires_at    timestamptz,
  first_dispatched_at timestamptz,
  last_error          text,
  completed_at        timestamptz,
  updated_at          timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT billing_records_pk PRIMARY KEY (idempotency_key),
  CONSTRAINT billing_records_uq UNIQUE (customer_id, billing_period),
  CONSTRAINT billing_records_period_valid CHECK (billguard.is_billing_period(billing_period)),
  CONSTRAINT billing_records_status_valid CHECK (status IN
    ('pending', 'dispatching', 'completed', 'failed', 'blocked', 'needs_review', 'unknown')),
  CONSTRAINT billing_records_amount_positive CHECK (amount_cents > 0),
  CONSTRAINT billing_records_completed_has_charge CHECK (status <> 'completed' OR charge_id IS NOT NULL)
);
COMMENT ON TABLE billguard.billing_records IS
  'Pre-flight claims: one per (customer_id, billing_period), each with its one idempotency key.';

-- The dispatch queue: rows that still need a request, in due order.
CREATE INDEX billing_records_due ON billguard.billing_records (next_attempt_at)
  WHERE status IN ('pending', 'dispatching', 'unknown');

-- A billing record is a financial fact: deleting it would let the same
-- (customer, period) be claimed again with a fresh history, and changing
-- what identifies the charge would break "same key, same parameters".
CREATE FUNCTION billguard.refuse_billing_record_change() RETURNS trigger
  LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' THEN
    RAISE EXCEPTION 'billing record %/% : customer, period, key, amount and payee never change',
                    OLD.customer_id, OLD.billing_period
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  RAISE EXCEPTION 'billguard.billing_records rows are never removed: % refused', TG_OP
    USING ERRCODE = 'integrity_constraint_violation';
END $$;

CREATE TRIGGER billing_records_keep_rows BEFORE DELETE OR TRUNCATE ON billguard.billing_records
  FOR EACH STATEMENT EXECUTE FUNCTION billguard.refuse_billing_record_change();

CREATE TRIGGER billing_records_frozen_identity BEFORE UPDATE ON billguard.billing_records
  FOR EACH ROW
  WHEN (OLD.customer_id IS DISTINCT FROM NEW.customer_id
     OR OLD.billing_period IS DISTINCT FROM NEW.billing_period
     OR OLD.idempotency_key IS DISTINCT FROM NEW.idempotency_key
     OR OLD.amount_cents IS DISTINCT FROM NEW.amount_cents
     OR OLD.currency IS DISTINCT FROM NEW.currency
     OR OLD.stripe_customer IS DISTINCT FROM NEW.stripe_customer
     OR OLD.payment_method IS DISTINCT FROM NEW.payment_method)
  EXECUTE FUNCTION billguard.refuse_billing_record_change();

-- How a record's status reads to a caller of bill_customer.
CREATE FUNCTION billguard.caller_status(record_status text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  RETURN CASE record_status
    WHEN 'completed' THEN 'already_completed'
    WHEN 'failed' THEN 'failed'
    WHEN 'blocked' THEN 'blocked'
    ELSE 'in_progress'   -- pending, dispatching, unknown, needs_review
  END;

-- Advisory lock classes (first key of the two-key advisory locks) that
-- serialise claims: one per billing period, and one for the scheduler
-- entity's journal.
CREATE FUNCTION billguard.period_lock_class() RETURNS integer
  LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 1651068161;   -- 'bg' 0x0001
CREATE FUNCTION billguard.scheduler_lock_class() RETURNS integer
  LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 1651068162;   -- 'bg' 0x0002
-- Billing one customer for one period, guarded by the pre-flight table.

CREATE FUNCTION billguard.bill_customer(customer_id text, billing_period text,
                                        request_id text DEFAULT NULL)
  RETURNS TABLE (status text, idempotency_key text, charge_id text)
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  customer text := bill_customer.customer_id;
  period   text := bill_customer.billing_period;
  key      text;
  existing record;
  account  billguard.accounts;
  claimed_at timestamptz;
BEGIN
  IF customer IS NULL THEN
    RAISE EXCEPTION 'customer_id must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM billguard.check_billing_period(period);
  IF octet_length(bill_customer.request_id) > 255 THEN
    RAISE EXCEPTION 'request_id must be at most 255 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  key := billguard.idempotency_key(customer, period);   -- also validates customer_id

  -- Guards 1 and 2: completed, in progress, or terminal. The record answers.
  SELECT r.status, r.idempotency_key, r.charge_id INTO existing
    FROM billguard.billing_records r
   WHERE r.customer_id = customer AND r.billing_period = period;
  IF FOUND THEN
    RETURN QUERY SELECT billguard.caller_status(existing.status), existing.idempotency_key,
                        existing.charge_id;
    RETURN;
  END IF;

  SELECT * INTO account FROM billguard.accounts a WHERE a.customer_id = customer;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'customer % is not in billguard.accounts', quote_literal(left(customer, 64))
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  IF NOT account.active THEN
    RAISE EXCEPTION 'customer % is not active', quote_literal(customer)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  -- Shared with other single claims, exclusive against bill_period (see there).
  PERFORM pg_advisory_xact_lock_shared(billguard.period_lock_class(), hashtext(period));

  -- The pre-flight claim. A concurrent caller that got there first makes
  -- this insert wait for its commit and then do nothing. No arbiter is
  -- named: the same claim conflicts on the key (billing_records_pk) as well
  -- as on (customer_id, billing_period), and both must mean "taken".
  INSERT INTO billguard.billing_records AS r
         (customer_id, billing_period, idempotency_key, amount_cents, currency,
          stripe_customer, payment_method, request_id)
  VALUES (customer, period, key, account.amount_cents, account.currency,
          account.stripe_customer, account.payment_method, bill_customer.request_id)
  ON CONFLICT DO NOTHING
  RETURNING r.created_at INTO claimed_at;
  IF NOT FOUND THEN
    SELECT r.status, r.idempotency_key, r.charge_id INTO STRICT existing
      FROM billguard.billing_records r
     WHERE r.customer_id = customer AND r.billing_period = period;
    RETURN QUERY SELECT billguard.caller_status(existing.status), existing.idempotency_key,
                        existing.charge_id;
    RETURN;
  END IF;

  -- The record is new, so its entity has no events yet: seq_nr 1.
  INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
  VALUES ('billing-' || customer || '-' || period, 1, customer, 'BillingInitiated',
          billguard.billing_initiated_event(customer, period, key, account.amount_cents,
                                            account.currency, claimed_at, bill_customer.request_id));
  PERFORM billguard.wake_dispatcher();
  RETURN QUERY SELECT 'initiated'::text, key, NULL::text;
END $$;
COMMENT ON FUNCTION billguard.bill_customer(text, text, text) IS
  'Claims (customer_id, billing_period) once and queues its charge; always answers, never creates a second record.';
-- Billing every active account once for a period, set-based.

-- The work of bill_period(); PL/pgSQL cannot name an input and an output
-- column alike, as bill_period's public signature does.
CREATE FUNCTION billguard.claim_period(period text)
  RETURNS TABLE (initiated bigint, already_completed bigint, in_progress bigint, failed bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  -- The anti-join below reads billing_records while the same statement
  -- inserts into it; planned as a nested loop over a seq scan (likely while
  -- the table is new and unanalysed) it would rescan the growing table per
  -- account. Hash and merge joins keep a large period linear.
  SET enable_nestloop = off
  AS $$
#variable_conflict use_column
DECLARE
  ns        text := billguard.key_namespace();
  scheduler_state jsonb;
BEGIN
  PERFORM billguard.check_billing_period(period);

  -- Claims of one period are serialised: bill_period holds the period's
  -- lock exclusively, bill_customer holds it shared. Once we have it, every
  -- earlier claim is committed and visible to the next statement, so a plain
  -- set-based INSERT of the accounts without a record claims each exactly
  -- once; no per-row speculative insertion, no row-order deadlocks.
  PERFORM pg_advisory_xact_lock(billguard.period_lock_class(), hashtext(period));
  BEGIN
    WITH claimed AS (
      INSERT INTO billguard.billing_records AS r
             (customer_id, billing_period, idempotency_key, amount_cents, currency,
              stripe_customer, payment_method)
      SELECT a.customer_id, period, billguard.idempotency_key(a.customer_id, period, ns),
             a.amount_cents, a.currency, a.stripe_customer, a.payment_method
        FROM billguard.accounts a
       WHERE a.active
         AND NOT EXISTS (SELECT FROM billguard.billing_records e
                          WHERE e.customer_id = a.customer_id AND e.billing_period = period)
      RETURNING r.customer_id, r.idempotency_key, r.amount_cents, r.currency, r.created_at
    ), journaled AS (
      INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
      SELECT 'billing-' || c.customer_id || '-' || period, 1, c.customer_id, 'BillingInitiated',
             billguard.billing_initiated_event(c.customer_id, period, c.idempotency_key,
                                               c.amount_cents, c.currency, c.created_at)
        FROM claimed c
      RETURNING 1
    )
    SELECT count(*) INTO initiated FROM journaled;
  EXCEPTION WHEN unique_violation THEN
    -- Only a REPEATABLE READ / SERIALIZABLE caller whose snapshot predates
    -- another claim gets here; nothing of this call is kept.
    RAISE EXCEPTION 'billing records of % were claimed concurrently; retry the transaction', period
      USING ERRCODE = 'serialization_failure';
  END;

  -- Everyone else's records: claims committed before we took the lock.
  SELECT count(*) FILTER (WHERE r.status = 'completed'),
         count(*) FILTER (WHERE r.status IN ('pending', 'dispatching', 'unknown', 'needs_review')),
         count(*) FILTER (WHERE r.status IN ('failed', 'blocked'))
    INTO already_completed, in_progress, failed
    FROM billguard.billing_records r
    JOIN billguard.accounts a ON a.customer_id = r.customer_id
   WHERE r.billing_period = period AND a.active;
  in_progress := in_progress - initiated;   -- our own claims are pending too

  -- The first time a period is billed, the scheduler entity records it.
  -- The advisory lock serialises appends to that one entity.
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  scheduler_state := billguard.entity_state('billing-scheduler');
  IF NOT (scheduler_state -> 'issued_periods') ? period THEN
    PERFORM billguard.append_event('billing-scheduler', (scheduler_state ->> 'seq_nr')::bigint,
                                   'BillingTickIssued',
                                   jsonb_build_object('billing_period', period,
                                                      'issued_at', clock_timestamp()));
  END IF;

  IF initiated > 0 THEN
    PERFORM billguard.wake_dispatcher();
  END IF;
  RETURN NEXT;
END $$;

CREATE FUNCTION billguard.bill_period(billing_period text)
  RETURNS TABLE (billing_period text, initiated bigint, already_completed bigint,
                 in_progress bigint, failed bigint)
  LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT bill_period.billing_period, c.initiated, c.already_completed, c.in_progress, c.failed
      FROM billguard.claim_period(bill_period.billing_period) c;
  END;
COMMENT ON FUNCTION billguard.bill_period(text) IS
  'Claims and queues one charge per active account for the period; idempotent and safe to run concurrently.';
-- What happened to a period, by status.

CREATE FUNCTION billguard.period_status(billing_period text)
  RETURNS TABLE (status text, count bigint, amount_cents bigint)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  PERFORM billguard.check_billing_period(period_status.billing_period);
  RETURN QUERY
    SELECT st.status, count(r.status), coalesce(sum(r.amount_cents), 0)::bigint
      FROM unnest(ARRAY['pending', 'dispatching', 'unknown', 'needs_review', 'completed',
                        'failed', 'blocked']) WITH ORDINALITY AS st (status, position)
      LEFT JOIN billguard.billing_records r
        ON r.status = st.status AND r.billing_period = period_status.billing_period
     GROUP BY st.status, st.position
     ORDER BY st.position;
END $$;
COMMENT ON FUNCTION billguard.period_status(text) IS
  'One row per record status for the period: how many records, and their amount in minor units.';
-- The dispatch queue: what the dispatcher worker claims, and how each
-- answer from Stripe is recorded. Every function runs in the worker's own
-- short transaction; no HTTP request is ever made while one is open.

-- Appends an event to a billing entity. Callers hold the record's row lock,
-- which serialises all writers of that entity, so max + 1 cannot race.
CREATE FUNCTION billguard.append_billing_event(customer_id text, billing_period text,
                                               event_type text, event jsonb)
  RETURNS void
  LANGUAGE plpgsql AS $$
DECLARE
  entity text := 'billing-' || customer_id || '-' || billing_period;
BEGIN
  INSERT INTO billguard.journal AS j (persistence_id, seq_nr, customer_id, event_type, event)
  VALUES (entity,
          coalesce((SELECT max(h.seq_nr) FROM billguard.journal h WHERE h.persistence_id = entity), 0) + 1,
          append_billing_event.customer_id, append_billing_event.event_type, append_billing_event.event);
END $$;

-- Exponential backoff with jitter, as Stripe's clients do: 0.5 s doubling,
-- capped, scaled by a random factor in [0.5, 1).
CREATE FUNCTION billguard.retry_delay(attempt integer, cap_seconds double precision DEFAULT 60)
  RETURNS interval
  LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RETURN make_interval(secs => least(0.5 * power(2, greatest(attempt - 1, 0)), cap_seconds)
                               * (0.5 + random() / 2));
END $$;

-- At dispatcher start: rows a previous dispatcher left 'dispatching' are due
-- now, to be re-sent with their stored key.
CREATE FUNCTION billguard.requeue_abandoned() RETURNS bigint
  LANGUAGE sql AS $$
  WITH requeued AS (
    UPDATE billguard.billing_records
       SET next_attempt_at = now(), lease_expires_at = NULL, updated_at = now()
     WHERE status = 'dispatching'
    RETURNING 1)
  SELECT count(*) FROM requeued;
$$;

-- Claims up to max_rows due records: status 'dispatching', attempts + 1,
-- first_dispatched_at set once, a lease (a dispatching row whose lease
-- expires is due again). action says what to send:
--   'charge'  POST the charge with the stored key;
--   'search'  look the charge up first: the outcome of an earlier attempt
--             is unknown (a cached 500), or the first dispatch is older than
--             idempotency_window, so Stripe may have pruned the key.
CREATE FUNCTION billguard.claim_due_records(max_rows integer, lease interval,
                                            idempotency_window interval)
  RETURNS TABLE (idempotency_key text, attempt integer, action text, customer_id text,
                 billing_period text, amount_cents bigint, currency text,
                 stripe_customer text, payment_method text)
  LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  -- The dispatcher commits its answers asynchronously (a lost answer is
  -- re-sent with the same key and replayed by Stripe), but a claim is
  -- flushed before any request leaves.
  PERFORM set_config('synchronous_commit', 'on', true);
  RETURN QUERY
  WITH due AS (
    SELECT r.idempotency_key, r.status, r.first_dispatched_at
      FROM billguard.billing_records r
     WHERE r.status IN ('pending', 'dispatching', 'unknown') AND r.next_attempt_at <= now()
     ORDER BY r.next_attempt_at
     LIMIT max_rows
       FOR UPDATE SKIP LOCKED
  ), claimed AS (
    UPDATE billguard.billing_records r
       SET status = 'dispatching',
           attempts = r.attempts + 1,
           first_dispatched_at = coalesce(r.first_dispatched_at, now()),
           lease_expires_at = now() + lease,
           next_attempt_at = now() + lease,
           updated_at = now()
      FROM due
     WHERE r.idempotency_key = due.idempotency_key
    RETURNING r.idempotency_key, r.attempts, r.customer_id, r.billing_period, r.amount_cents,
              r.currency, r.stripe_customer, r.payment_method,
              CASE WHEN due.status = 'unknown'
                     OR due.first_dispatched_at < now() - idempotency_window
                   THEN 'search' ELSE 'charge' END AS action
  ), journaled AS (
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    SELECT p.id,
           coalesce((SELECT max(j.seq_nr) FROM billguard.journal j WHERE j.persistence_id = p.id), 0) + 1,
           c.customer_id, 'ChargeAttempted',
           jsonb_build_object('attempt', c.attempts, 'action', c.action,
                              'idempotency_key', c.idempotency_key, 'at', now())
      FROM claimed c
     CROSS JOIN LATERAL (SELECT 'billing-' || c.customer_id || '-' || c.billing_period AS id) p
  )
  SELECT c.idempotency_key, c.attempts, c.action, c.customer_id, c.billing_period, c.amount_cents,
         c.currency, c.stripe_customer, c.payment_method
    FROM claimed c;
END $$;

-- The record of one dispatch attempt, locked, or NULL when the record has
-- moved on (its lease was taken over, an operator requeued it): a late
-- answer to an old attempt must not overwrite a newer state.
CREATE FUNCTION billguard.lock_attempt(key text, attempt integer)
  RETURNS billguard.billing_records
  LANGUAGE plpgsql AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  SELECT * INTO rec FROM billguard.billing_records r
   WHERE r.idempotency_key = key AND r.status = 'dispatching' AND r.attempts = attempt
     FOR UPDATE;
  RETURN rec;
END $$;

-- Whether a response body is JSON, without raising (extension/journal_events.cpp).
CREATE FUNCTION billguard.is_json(body text) RETURNS boolean
  LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_is_json';

-- jsonb of a response body, or NULL when it is not JSON.
CREATE FUNCTION billguard.json_or_null(body text) RETURNS jsonb
  LANGUAGE sql IMMUTABLE
  RETURN CASE WHEN billguard.is_json(body) THEN body::jsonb END;

-- What an answer from Stripe means, following Stripe's documented
-- semantics (see DESIGN.md and STRIPE.md):
--   completed     2xx
--   paused        401/403: the API key is wrong; pause everything, fail nothing
--   needs_review  idempotency_error other than key-in-use: never re-sent
--   retry         409 key in use, 429, 502/503/504 and other 5xx, or
--                 Stripe-Should-Retry: true
--   unknown       500: Stripe cached an indeterminate result for the key
--   failed        other 4xx (402 card_error, 400/404 invalid_request_error),
--                 or Stripe-Should-Retry: false
CREATE FUNCTION billguard.classify_stripe_response(http_status integer, should_retry boolean,
                                                   error_type text, error_code text)
  RETURNS text
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  RETURN CASE
    WHEN http_status BETWEEN 200 AND 299 THEN 'completed'
    WHEN http_status IN (401, 403) THEN 'paused'
    WHEN error_type = 'idempotency_error' AND error_code IS DISTINCT FROM 'idempotency_key_in_use'
      THEN 'needs_review'
    WHEN should_retry IS TRUE THEN 'retry'
    WHEN http_status = 500 THEN 'unknown'
    WHEN should_retry IS FALSE THEN 'failed'
    WHEN http_status IN (409, 429) OR http_status >= 500 THEN 'retry'
    ELSE 'failed'
  END;

-- Records the answer to a charge request of attempt `attempt`; returns the
-- outcome (see classify_stripe_response) or 'stale' when the record is no
-- longer this attempt's (its lease was taken over).
CREATE FUNCTION billguard.record_charge_response(key text, attempt integer, http_status integer,
                                                 body text, should_retry text, replayed boolean,
                                                 max_attempts integer, settle_delay interval)
  RETURNS text
  LANGUAGE plpgsql AS $$
DECLARE
  rec     billguard.billing_records;
  answer  jsonb := billguard.json_or_null(body);
  err     jsonb := answer -> 'error';
  outcome text;
  detail  jsonb;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN 'stale';
  END IF;

  outcome := billguard.classify_stripe_response(
    http_status, CASE lower(should_retry) WHEN 'true' THEN true WHEN 'false' THEN false END,
    err ->> 'type', err ->> 'code');
  IF outcome = 'completed' AND coalesce(answer ->> 'id', '') = '' THEN
    outcome := 'needs_review';   -- a 2xx without an object id: a person must look
    err := jsonb_build_object('type', 'api_error', 'message', 'success response without an id');
  ELSIF outcome = 'completed'
        AND answer ->> 'status' NOT IN ('succeeded', 'processing', 'pending') THEN
    -- Created but not charged (e.g. requires_action off-session): terminal.
    outcome := 'failed';
    err := jsonb_build_object('type', 'payment_status', 'code', answer ->> 'status',
                              'message', format('%s %s is %s: not charged', answer ->> 'object',
                                                answer ->> 'id', answer ->> 'status'));
  END IF;
  detail := jsonb_strip_nulls(jsonb_build_object(
    'http_status', http_status, 'type', err ->> 'type', 'code', err ->> 'code',
    'decline_code', err ->> 'decline_code', 'message', left(err ->> 'message', 500),
    'attempt', attempt));
  IF outcome = 'retry' AND attempt >= max_attempts AND http_status NOT IN (409, 429) THEN
    outcome := 'failed';
  END IF;

  CASE outcome
    WHEN 'completed' THEN
      UPDATE billguard.billing_records r
         SET status = 'completed', charge_id = answer ->> 'id', completed_at = now(),
             lease_expires_at = NULL, last_error = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingCompleted',
        jsonb_build_object('charge_id', answer ->> 'id', 'replayed', coalesce(replayed, false),
                           'http_status', http_status, 'attempt', attempt));
    WHEN 'paused' THEN
      -- The key was refused before anything was charged: the attempt does
      -- not count, and the record waits for a fixed key.
      UPDATE billguard.billing_records r
         SET status = 'pending', attempts = r.attempts - 1, next_attempt_at = now(),
             lease_expires_at = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
    WHEN 'retry' THEN
      UPDATE billguard.billing_records r
         SET status = 'pending', next_attempt_at = now() + billguard.retry_delay(attempt),
             lease_expires_at = NULL, last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingFailed',
        detail || jsonb_build_object('terminal', false));
    WHEN 'unknown' THEN
      -- Search is eventually consistent: do not conclude "absent" before
      -- the settle delay has passed.
      UPDATE billguard.billing_records r
         SET status = 'unknown', next_attempt_at = now() + settle_delay,
             lease_expires_at = NULL, last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ChargeUnknown',
        detail);
    WHEN 'needs_review' THEN
      UPDATE billguard.billing_records r
         SET status = 'needs_review', lease_expires_at = NULL,
             last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'NeedsReview',
        detail);
    ELSE  -- failed
      UPDATE billguard.billing_records r
         SET status = 'failed', lease_expires_at = NULL,
             last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingFailed',
        detail || jsonb_build_object('terminal', true));
  END CASE;
  RETURN outcome;
END $$;

-- One line for billing_records.last_error, e.g.
-- "402 card_error/card_declined: Your card was declined."
CREATE FUNCTION billguard.error_text(detail jsonb) RETURNS text
  LANGUAGE sql IMMUTABLE
  RETURN concat_ws(' ', detail ->> 'http_status',
                   nullif(concat_ws('/', detail ->> 'type', detail ->> 'code'), '') || ':',
                   detail ->> 'message');

-- Records a request that got no HTTP answer (connection error, timeout).
-- The charge may or may not exist: retry with the same key until a
-- definitive answer, and fail only after max_attempts.
CREATE FUNCTION billguard.record_transport_error(key text, attempt integer, message text,
                                                 max_attempts integer)
  RETURNS text
  LANGUAGE plpgsql AS $$
DECLARE
  rec      billguard.billing_records;
  terminal boolean := attempt >= max_attempts;
  detail   jsonb := jsonb_build_object('type', 'network', 'message', left(message, 500),
                                       'attempt', attempt);
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN 'stale';
  END IF;
  UPDATE billguard.billing_records r
     SET status = CASE WHEN terminal THEN 'failed' ELSE 'pending' END,
         next_attempt_at = now() + billguard.retry_delay(attempt),
         lease_expires_at = NULL,
         last_error = 'network: ' || left(message, 500)
                      || CASE WHEN terminal THEN ' (outcome unknown: reconcile before retrying)' ELSE '' END,
         updated_at = now()
   WHERE r.idempotency_key = key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingFailed',
    detail || jsonb_build_object('terminal', terminal));
  RETURN CASE WHEN terminal THEN 'failed' ELSE 'retry' END;
END $$;

-- Records the answer to a search for the record's charge. Returns
-- 'completed' (found: ChargeReconciled), 'charge' (not found: send the
-- charge now, same key, same lease), 'paused', 'retry' or 'stale'.
CREATE FUNCTION billguard.record_search_result(key text, attempt integer, http_status integer,
                                               body text)
  RETURNS text
  LANGUAGE plpgsql AS $$
DECLARE
  rec    billguard.billing_records;
  answer jsonb := billguard.json_or_null(body);
  found  jsonb;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN 'stale';
  END IF;
  IF http_status IN (401, 403) THEN
    UPDATE billguard.billing_records r
       SET status = 'unknown', attempts = r.attempts - 1, next_attempt_at = now(),
           lease_expires_at = NULL, updated_at = now()
     WHERE r.idempotency_key = key;
    RETURN 'paused';
  END IF;
  IF http_status <> 200 OR jsonb_typeof(answer -> 'data') IS DISTINCT FROM 'array' THEN
    -- We still do not know whether an earlier attempt charged: stay unknown.
    UPDATE billguard.billing_records r
       SET status = 'unknown', next_attempt_at = now() + billguard.retry_delay(attempt),
           lease_expires_at = NULL,
           last_error = 'search failed with HTTP ' || http_status, updated_at = now()
     WHERE r.idempotency_key = key;
    RETURN 'retry';
  END IF;

  SELECT o INTO found FROM jsonb_array_elements(answer -> 'data') o
   WHERE o -> 'metadata' ->> 'billguard_key' = key
     AND (o ->> 'status' IN ('succeeded', 'processing') OR (o ->> 'paid')::boolean)
   LIMIT 1;
  IF found IS NULL THEN
    RETURN 'charge';
  END IF;
  UPDATE billguard.billing_records r
     SET status = 'completed', charge_id = found ->> 'id', completed_at = now(),
         lease_expires_at = NULL, last_error = NULL, updated_at = now()
   WHERE r.idempotency_key = key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ChargeReconciled',
    jsonb_build_object('charge_id', found ->> 'id', 'via', 'search', 'attempt', attempt));
  RETURN 'completed';
END $$;

-- Returns a claimed record that was never sent to the queue (the dispatcher
-- paused before sending it): the attempt does not count, and the record is
-- due again at once. A record claimed for a search goes back to 'unknown'.
CREATE FUNCTION billguard.release_claim(key text, attempt integer, search boolean)
  RETURNS text
  LANGUAGE plpgsql AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN 'stale';
  END IF;
  UPDATE billguard.billing_records r
     SET status = CASE WHEN search THEN 'unknown' ELSE 'pending' END,
         attempts = r.attempts - 1, next_attempt_at = now(), lease_expires_at = NULL,
         updated_at = now()
   WHERE r.idempotency_key = key;
  RETURN 'released';
END $$;
-- What operators see and do: the dispatcher's state, and deliberate
-- requeueing or resolution of records that need a person.

CREATE FUNCTION billguard.dispatcher_state(
    OUT pid integer, OUT started_at timestamptz, OUT paused boolean, OUT pause_reason text,
    OUT in_flight integer, OUT requests_sent bigint)
  LANGUAGE c VOLATILE
  AS 'MODULE_PATHNAME', 'billguard_dispatcher_state';

CREATE VIEW billguard.dispatch_status AS
SELECT coalesce(EXISTS (SELECT FROM pg_catalog.pg_stat_activity a
                         WHERE a.pid = d.pid AND a.backend_type = 'billguard dispatcher'), false)
         AS worker_running,
       d.pid AS worker_pid,
       d.started_at AS worker_started_at,
       coalesce(d.paused, false) AS paused,
       d.pause_reason,
       coalesce(d.in_flight, 0) AS in_flight,
       coalesce(d.requests_sent, 0) AS requests_sent,
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.status IN ('pending', 'dispatching', 'unknown') AND r.next_attempt_at <= now()) AS due,
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.status IN ('pending', 'dispatching', 'unknown')) AS outstanding,
       (SELECT now() - min(r.created_at) FROM billguard.billing_records r
         WHERE r.status IN ('pending', 'dispatching', 'unknown')) AS oldest_outstanding_age,
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.status = 'completed' AND r.completed_at > now() - interval '1 minute') AS completed_last_minute,
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.status IN ('failed', 'needs_review') AND r.updated_at > now() - interval '1 minute') AS failed_last_minute
  FROM billguard.dispatcher_state() d;
COMMENT ON VIEW billguard.dispatch_status IS
  'The dispatcher: running or not, paused and why, requests in flight, the queue, recent outcomes.';

-- The record of (customer_id, billing_period), locked, if its status is one
-- of `allowed`; otherwise a clear error naming what `action` needs.
CREATE FUNCTION billguard.record_for_operator(customer_id text, billing_period text,
                                              allowed text[], action text)
  RETURNS billguard.billing_records
  LANGUAGE plpgsql AS $$
DECLARE
  rec billguard.billing_records;
  n   int := cardinality(allowed);
BEGIN
  PERFORM billguard.check_billing_period(record_for_operator.billing_period);
  SELECT * INTO rec FROM billguard.billing_records r
   WHERE r.customer_id = record_for_operator.customer_id
     AND r.billing_period = record_for_operator.billing_period
     FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no billing record for % in %',
                    quote_literal(left(record_for_operator.customer_id, 64)),
                    record_for_operator.billing_period
      USING ERRCODE = 'no_data_found';
  END IF;
  IF rec.status <> ALL (allowed) THEN
    RAISE EXCEPTION 'billing record %/% is %, only % or % records can be %',
                    rec.customer_id, rec.billing_period, rec.status,
                    array_to_string(allowed[1:n - 1], ', '), allowed[n], action
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN rec;
END $$;

-- Requeues a failed or needs_review record deliberately. It keeps its key
-- and its first dispatch time, so a record older than the idempotency
-- window is searched for at Stripe before anything is re-sent.
CREATE FUNCTION billguard.retry_record(customer_id text, billing_period text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  rec := billguard.record_for_operator(retry_record.customer_id, retry_record.billing_period,
                                       ARRAY['failed', 'needs_review'], 'retried');
  UPDATE billguard.billing_records r
     SET status = 'pending', attempts = 0, next_attempt_at = now(), updated_at = now()
   WHERE r.idempotency_key = rec.idempotency_key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'RecordRequeued',
    jsonb_build_object('previous_status', rec.status, 'last_error', rec.last_error,
                       'by', session_user));
  PERFORM billguard.wake_dispatcher();
  RETURN 'pending';
END $$;

-- Marks a reviewed record completed with the charge a person found.
CREATE FUNCTION billguard.resolve_record(customer_id text, billing_period text, charge_id text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  IF resolve_record.charge_id IS NULL OR resolve_record.charge_id !~ '^(pi|ch)_[A-Za-z0-9_]+$' THEN
    RAISE EXCEPTION 'charge_id must be a Stripe id (pi_... or ch_...)'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  rec := billguard.record_for_operator(resolve_record.customer_id, resolve_record.billing_period,
                                       ARRAY['needs_review', 'failed', 'unknown'], 'resolved');
  UPDATE billguard.billing_records r
     SET status = 'completed', charge_id = resolve_record.charge_id, completed_at = now(),
         last_error = NULL, updated_at = now()
   WHERE r.idempotency_key = rec.idempotency_key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ReviewResolved',
    jsonb_build_object('charge_id', resolve_record.charge_id, 'previous_status', rec.status,
                       'by', session_user));
  RETURN 'completed';
END $$;
-- pg_dump must carry the data tables: losing billing_records in a dump and
-- restore would let every (customer, period) be claimed again.
SELECT pg_catalog.pg_extension_config_dump('billguard.accounts', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.billing_records', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.journal', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.snapshots', '');

-- Nothing is granted to PUBLIC. Application roles get EXECUTE on the
-- functions they call (see README, "Privileges"); the SECURITY DEFINER
-- functions do the table access.
REVOKE ALL ON ALL TABLES IN SCHEMA billguard FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA billguard FROM PUBLIC;
REVOKE ALL ON SCHEMA billguard FROM PUBLIC;
