-- The scheduler as billguard.scheduler_status shows it: enabled, the next
-- instant it bills (in the past while the most recent due period waits to be
-- issued), the last period issued and when, how many due periods the
-- scheduler will not bill by itself (see due_periods()), why it bills
-- nothing now (this database is a copy or a restore not adopted, it shares
-- its namespace, its tick waits for a lock) and how many periods were
-- issued before their month ended (see issued_early()).
CREATE OR REPLACE FUNCTION billguard.scheduler_state(
    OUT enabled boolean, OUT bill_day integer, OUT bill_hour_utc integer,
    OUT next_bill_at timestamptz, OUT last_period_issued text,
    OUT last_period_issued_at timestamptz, OUT missed_periods bigint,
    OUT pause_reason text, OUT issued_early bigint)
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  schedule record;
  state    jsonb := billguard.entity_state('billing-scheduler');
  -- The tick would bill the most recent due period (see scheduler_tick()).
  scheduled boolean;
BEGIN
  SELECT * INTO schedule FROM billguard.current_schedule();
  enabled := schedule.auto_bill = 'monthly';
  bill_day := schedule.bill_day;
  bill_hour_utc := schedule.bill_hour_utc;
  scheduled := enabled AND NOT (state -> 'issued_periods') ? schedule.due_period
               AND billguard.issued_after(schedule.due_period, state,
                                          (SELECT s.now FROM billguard.scheduler_settings() s)) IS NULL;
  next_bill_at := CASE WHEN NOT enabled THEN NULL
                       WHEN scheduled THEN schedule.due_at
                       ELSE schedule.next_due_at END;
  last_period_issued := state ->> 'last_issued_period';
  last_period_issued_at := (state ->> 'last_issued_at')::timestamptz;
  -- Without reading billing_records: the view may be polled.
  missed_periods := cardinality(array_remove(
    billguard.never_issued(schedule.due_period,
                           coalesce(state -> 'issued_periods', '[]'::jsonb)),
    CASE WHEN scheduled THEN schedule.due_period END));
  pause_reason := coalesce(billguard.billing_database_problem(),
                           (SELECT d.scheduler_pause_reason FROM billguard.dispatcher_state() d));
  issued_early := cardinality(billguard.issued_early(
    state -> 'issued_periods', (SELECT s.now FROM billguard.scheduler_settings() s)));
END $$;
