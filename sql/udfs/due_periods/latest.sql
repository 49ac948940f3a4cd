-- The due periods never issued, with the instant each became due. scheduled:
-- the scheduler bills it by itself (the most recent, with auto_bill =
-- monthly, unless a later period was issued: see issued_after()); it never
-- bills the others: bill each deliberately with bill_period. records counts
-- what bill_customer claimed of it already. issued_early: a period issued
-- before its month ended (see issued_early()), listed until it has: once
-- it is due, bill_period bills the accounts added since.
CREATE OR REPLACE FUNCTION billguard.due_periods()
  RETURNS TABLE (billing_period text, due_at timestamptz, records bigint, scheduled boolean,
                 issued_early boolean)
  LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  state    jsonb := billguard.entity_state('billing-scheduler');
  issued   jsonb := coalesce(state -> 'issued_periods', '[]'::jsonb);
  missed   text[];
  early    text[];
  at       timestamptz := (SELECT s.now FROM billguard.scheduler_settings() s);
BEGIN
  SELECT * INTO schedule FROM billguard.current_schedule();
  missed := billguard.never_issued(schedule.due_period, issued);
  early := billguard.issued_early(issued, at);
  IF cardinality(missed) = 0 AND cardinality(early) = 0 THEN
    RETURN;    -- no reason to read billing_records
  END IF;
  RETURN QUERY
    SELECT p.period,
           billguard.bill_instant(p.period, schedule.bill_day, schedule.bill_hour_utc),
           coalesce(r.records, 0),
           NOT p.early AND p.period = schedule.due_period AND schedule.auto_bill = 'monthly'
             AND billguard.issued_after(p.period, state, at) IS NULL,
           p.early
      FROM (SELECT m, false FROM unnest(missed) AS m
            UNION ALL SELECT e, true FROM unnest(early) AS e) AS p(period, early)
      LEFT JOIN (SELECT br.billing_period, count(*) AS records
                   FROM billguard.billing_records br
                  WHERE br.billing_period = ANY (missed || early)
                  GROUP BY br.billing_period) r ON r.billing_period = p.period
     ORDER BY p.period;
END $$;
COMMENT ON FUNCTION billguard.due_periods() IS
  'Due periods never issued; the scheduler bills only the most recent (scheduled), the rest only bill_period does; and periods issued before they were due (issued_early).';
