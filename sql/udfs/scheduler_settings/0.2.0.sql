-- The settings and the scheduler's notion of now: billguard.scheduler_now
-- (test-only, superuser-only) or the transaction's start.
CREATE OR REPLACE FUNCTION billguard.scheduler_settings(OUT auto_bill text, OUT bill_day integer,
                                             OUT bill_hour_utc integer, OUT now timestamptz)
  LANGUAGE c STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_scheduler_settings';
