-- Withdrawing a billing that was never sent: by an operator (cancel_record)
-- or because its account was deactivated. Only a record no dispatcher ever
-- claimed is provably unsent; one that was claimed may have charged the
-- customer already, and must reach its outcome. The dispatcher claims only
-- pending, dispatching and unknown records, so a cancelled one is never sent.
-- A cancelled record never claimed by a dispatcher may be claimed again
-- (reclaim_record): the correction of an amount frozen by its claim.

\ir ../udfs/cancel_unsent/latest.sql
\ir ../udfs/cancel_record/latest.sql
\ir ../udfs/reclaim_record/latest.sql
\ir ../udfs/cancel_unsent_of_deactivated/latest.sql

CREATE TRIGGER accounts_deactivated AFTER UPDATE OF active ON billguard.accounts
  FOR EACH ROW WHEN (OLD.active AND NOT NEW.active)
  EXECUTE FUNCTION billguard.cancel_unsent_of_deactivated();
-- Also when the apply worker of a subscription deactivates the account.
ALTER TABLE billguard.accounts ENABLE ALWAYS TRIGGER accounts_deactivated;
