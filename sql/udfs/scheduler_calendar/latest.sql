-- The calendar at instant `at`: the most recent period due (last month's
-- once this month's bill instant has passed, else the month before), the
-- instant it became due, and the instant the next one does.
CREATE OR REPLACE FUNCTION billguard.scheduler_calendar(at timestamptz, bill_day integer,
                                             bill_hour_utc integer,
                                             OUT due_period text, OUT due_at timestamptz,
                                             OUT next_due_at timestamptz)
  LANGUAGE plpgsql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  this_month timestamp := date_trunc('month', at AT TIME ZONE 'UTC');
BEGIN
  IF bill_day NOT BETWEEN 1 AND 28 OR bill_hour_utc NOT BETWEEN 0 AND 23 THEN
    RAISE EXCEPTION 'bill_day must be 1..28 and bill_hour_utc 0..23, got % and %',
                    bill_day, bill_hour_utc
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  due_period := to_char(this_month - interval '1 month', 'YYYY-MM');
  IF at < billguard.bill_instant(due_period, bill_day, bill_hour_utc) THEN
    due_period := to_char(this_month - interval '2 months', 'YYYY-MM');
  END IF;
  due_at := billguard.bill_instant(due_period, bill_day, bill_hour_utc);
  next_due_at := billguard.bill_instant(to_char(to_date(due_period, 'YYYY-MM') + interval '1 month',
                                                'YYYY-MM'),
                                        bill_day, bill_hour_utc);
END $$;
