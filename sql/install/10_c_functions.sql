-- Functions implemented in C++ (extension/).
--
-- Every function of the extension pins search_path = pg_catalog, pg_temp,
-- except the six pure C ones called once per row (key_namespace,
-- idempotency_key, is_billing_period and billing_initiated_event here,
-- is_valid_customer_id, charge_request_body): they run no SQL and look no
-- name up, so a search_path cannot reach them, and the setting would triple
-- their cost (each call would save, set and restore it: idempotency_key
-- 0.26 -> 0.80 us). pgTAP 12 lists them; any other function without the
-- setting fails it.

\ir ../udfs/key_namespace/latest.sql
\ir ../udfs/idempotency_key/latest.sql
\ir ../udfs/wake_dispatcher/latest.sql
\ir ../udfs/is_billing_period/latest.sql
\ir ../udfs/check_billing_period/latest.sql
\ir ../udfs/billing_initiated_event/latest.sql
