-- The proxy's two decisions per forwarded request: vault_authorize before
-- it forwards (may this key make this call, and does the budget have room),
-- vault_settle after Stripe answered. Decisions on one Idempotency-Key are
-- serialised by an advisory lock of that key, so a retry is counted once.
-- The budget's committed sum (80_vault_ledger.sql) changes only when a
-- reservation starts or stops being counted: a reservation, a release, a
-- success after a release. That change takes the budget's row lock, as the
-- last write before the commit, so that concurrent decisions wait on it as
-- briefly as possible and no concurrency overspends a cap; a success
-- settling a reservation leaves the budget's row alone. Each decision
-- writes one vault_audit row.

\ir ../udfs/lock_vault_idempotency_key/latest.sql
\ir ../udfs/stripe_error_body/latest.sql
\ir ../udfs/vault_authorize/latest.sql
\ir ../udfs/lock_vault_reservation/latest.sql
\ir ../udfs/close_vault_reservation/latest.sql
\ir ../udfs/recount_vault_budget/latest.sql
\ir ../udfs/vault_settle/latest.sql
\ir ../udfs/vault_reconcile/latest.sql
\ir ../udfs/vault_reservations_in_doubt/latest.sql
