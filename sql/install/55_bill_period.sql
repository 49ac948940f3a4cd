-- Billing every active account once for a period, set-based.

\ir ../udfs/claim_period/latest.sql
\ir ../udfs/bill_period/latest.sql
