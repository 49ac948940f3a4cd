-- Folding events into entity state, snapshots and retention.
-- The state is a read model for people and tools: billing_records, not a
-- snapshot, decides whether a charge may be sent.

\ir ../udfs/state_version/latest.sql
\ir ../udfs/initial_state/latest.sql
\ir ../udfs/apply_event/latest.sql
\ir ../udfs/upcast_state/latest.sql
\ir ../udfs/entity_state/latest.sql
\ir ../udfs/save_snapshot/latest.sql
\ir ../udfs/apply_retention/latest.sql
