-- What a customer id may be, in one place: the CHECK on billguard.accounts
-- and the refusal of look-alike ids by the update from 0.1.0 call it.
\ir ../udfs/is_valid_customer_id/latest.sql
