-- What operators see and do: the dispatcher's state, and deliberate
-- requeueing or resolution of records that need a person.

\ir ../udfs/dispatcher_state/latest.sql
\ir ../views/dispatch_status/latest.sql
\ir ../udfs/record_for_operator/latest.sql
\ir ../udfs/requeue_record/latest.sql
\ir ../udfs/retry_record/latest.sql
\ir ../udfs/retry_period/latest.sql
\ir ../udfs/resolve_record/latest.sql
