-- Answers for callers: await_billing() returns a billing's outcome as soon
-- as its record reaches a terminal status, woken by the COMMIT that put it
-- there (extension/terminal_wakeups.cpp), never by polling the table.

\ir ../udfs/is_terminal_status/latest.sql
\ir ../udfs/announce_terminal_status/latest.sql

CREATE TRIGGER billing_records_terminal_wakeup BEFORE UPDATE OF status ON billguard.billing_records
  FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status
        AND NEW.status IN ('completed', 'failed', 'blocked', 'needs_review', 'cancelled',
                           'below_minimum'))
  EXECUTE FUNCTION billguard.announce_terminal_status();

\ir ../udfs/terminal_commits/latest.sql
\ir ../udfs/await_terminal_commit/latest.sql
\ir ../udfs/written_by_this_transaction/latest.sql
\ir ../udfs/await_billing/latest.sql
