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

\ir ../udfs/refuse_journal_change/latest.sql

CREATE TRIGGER journal_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON billguard.journal
  FOR EACH STATEMENT EXECUTE FUNCTION billguard.refuse_journal_change();

\ir ../udfs/highest_seq_nr/latest.sql
\ir ../udfs/append_event/latest.sql
\ir ../udfs/events/latest.sql
