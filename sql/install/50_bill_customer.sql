-- Billing one customer for one period, guarded by the pre-flight table.

\ir ../udfs/bill_customer/latest.sql
