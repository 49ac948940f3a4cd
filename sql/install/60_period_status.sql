-- What happened to a period, by status and currency.

\ir ../udfs/period_status/latest.sql
