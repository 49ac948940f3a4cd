-- The instant a period YYYY-MM becomes due: bill_hour_utc on bill_day of
-- the month after it, in UTC.
CREATE OR REPLACE FUNCTION billguard.bill_instant(billing_period text, bill_day integer,
                                       bill_hour_utc integer)
  RETURNS timestamptz
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN (to_date(billing_period, 'YYYY-MM') + interval '1 month'
          + make_interval(days => bill_day - 1, hours => bill_hour_utc)) AT TIME ZONE 'UTC';
