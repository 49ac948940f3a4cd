-- The dispatch queue: what the dispatcher worker claims, and how each
-- answer from Stripe is recorded. Every function runs in the worker's own
-- short transaction; no HTTP request is ever made while one is open.

\ir ../udfs/append_billing_event/latest.sql
\ir ../udfs/retry_delay/latest.sql
\ir ../udfs/requeue_abandoned/latest.sql
\ir ../udfs/charge_request_body/latest.sql
\ir ../udfs/claim_due_records/latest.sql
\ir ../udfs/lock_attempt/latest.sql
\ir ../udfs/missed_attempt/latest.sql
\ir ../udfs/error_text/latest.sql
\ir ../udfs/record_answers/latest.sql
\ir ../udfs/record_charge_response/latest.sql
\ir ../udfs/record_search_result/latest.sql
\ir ../udfs/release_claim/latest.sql
