-- The schedule at the scheduler's now: its settings, the most recent period
-- due, the instant it became due and the instant the next one does.
CREATE OR REPLACE FUNCTION billguard.current_schedule(OUT auto_bill text, OUT bill_day integer,
                                           OUT bill_hour_utc integer, OUT due_period text,
                                           OUT due_at timestamptz, OUT next_due_at timestamptz)
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT s.auto_bill, s.bill_day, s.bill_hour_utc, c.due_period, c.due_at, c.next_due_at
      FROM billguard.scheduler_settings() s,
           LATERAL billguard.scheduler_calendar(s.now, s.bill_day, s.bill_hour_utc) c;
  END;
