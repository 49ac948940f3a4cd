-- The scheduler: with billguard.auto_bill = monthly, each database's
-- dispatcher bills the previous calendar month once the UTC calendar passes
-- bill_day at bill_hour_utc (extension/scheduler.cpp calls scheduler_tick()).
-- Which period is due follows from the calendar alone, never from when a
-- worker started. The guard is the period's BillingTickIssued on
-- billing-scheduler; billing_records stays the authority when the journal
-- or a snapshot is wrong.

-- The settings and the scheduler's notion of now: billguard.scheduler_now
-- (test-only, superuser-only) or the transaction's start.
CREATE FUNCTION billguard.scheduler_settings(OUT auto_bill text, OUT bill_day integer,
                                             OUT bill_hour_utc integer, OUT now timestamptz)
  LANGUAGE c STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_scheduler_settings';

-- The instant a period YYYY-MM becomes due: bill_hour_utc on bill_day of
-- the month after it, in UTC.
CREATE FUNCTION billguard.bill_instant(billing_period text, bill_day integer,
                                       bill_hour_utc integer)
  RETURNS timestamptz
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN (to_date(billing_period, 'YYYY-MM') + interval '1 month'
          + make_interval(days => bill_day - 1, hours => bill_hour_utc)) AT TIME ZONE 'UTC';

-- The calendar at instant `at`: the most recent period due (last month's
-- once this month's bill instant has passed, else the month before), the
-- instant it became due, and the instant the next one does.
CREATE FUNCTION billguard.scheduler_calendar(at timestamptz, bill_day integer,
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

-- The schedule at the scheduler's now: its settings, the most recent period
-- due, the instant it became due and the instant the next one does.
CREATE FUNCTION billguard.current_schedule(OUT auto_bill text, OUT bill_day integer,
                                           OUT bill_hour_utc integer, OUT due_period text,
                                           OUT due_at timestamptz, OUT next_due_at timestamptz)
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT s.auto_bill, s.bill_day, s.bill_hour_utc, c.due_period, c.due_at, c.next_due_at
      FROM billguard.scheduler_settings() s,
           LATERAL billguard.scheduler_calendar(s.now, s.bill_day, s.bill_hour_utc) c;
  END;

-- The latest period after due_period that billing-scheduler's state
-- (scheduler_state) lists as issued once its month had ended, or NULL. The
-- scheduler never goes back behind one: moving bill_day or bill_hour_utc
-- later can take the calendar's due period back a month, to one the
-- scheduler had passed, and so can a clock stepped back (an hour after the
-- scheduler billed 2026-08 on 2026-09-01, the calendar says 2026-07 is due).
-- What counts is the clock when the period was issued (ended_when_issued),
-- not the clock now. A period issued before its month ended (billed in
-- advance, or a mistyped year) does not count until its month has ended by
-- the clock `at`: it keeps no due period from being billed.
CREATE FUNCTION billguard.issued_after(due_period text, scheduler_state jsonb, at timestamptz)
  RETURNS text
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT max(i.period COLLATE "C")
            FROM jsonb_array_elements_text(coalesce(scheduler_state -> 'issued_periods', '[]'::jsonb))
                   AS i(period)
           WHERE i.period COLLATE "C" > due_period
             AND (coalesce(scheduler_state -> 'ended_when_issued', '[]'::jsonb) ? i.period
                  OR i.period COLLATE "C" < to_char(at AT TIME ZONE 'UTC', 'YYYY-MM')));

-- One tick of the scheduler, in the dispatcher's transaction: bills the most
-- recent due period unless billing-scheduler has issued it. outcome:
--   billed          bill_period claimed the accounts without a record
--   already_issued  BillingTickIssued is in the scheduler's state: nothing
--   already_billed  the state did not list the period, yet billing_records
--                   held every record it would claim (a stale or older
--                   snapshot; or bill_customer for every account): nothing
--                   was claimed, and the worker logs the inconsistency
--   busy            a session bills this period right now, or has billed a
--                   period in a transaction still open (it holds the
--                   period's lock or billing-scheduler's); the worker tries
--                   again shortly rather than wait for either lock
--   passed          a later period was issued already once its month had
--                   ended: bill_day or bill_hour_utc moved later, or a clock
--                   stepped back, took the calendar back to a period the
--                   scheduler had passed (see issued_after()).
--                   Nothing: billing it is a person's decision (due_periods)
--   not_billing_database  this database is a copy or a restore that was not
--                   adopted (billing_database_problem()): nothing
-- existing counts the period's records from before this tick.
-- search_first_reason, when the tick claims more than the dispatcher's
-- billguard.idempotency_window after the period became due: an earlier
-- system may have charged the period already (a backup restored from before
-- its tick, a reinstall with the accounts imported again, auto_bill switched
-- on for a period billed elsewhere), with keys Stripe has pruned since. Each
-- record claimed carries the reason, and the dispatcher searches for its
-- charge before sending one (claim_due_records). A person's bill_period of
-- a past period sends plain charges: see the README's scheduler section.
CREATE FUNCTION billguard.scheduler_tick()
  RETURNS TABLE (billing_period text, outcome text, initiated bigint, existing bigint,
                 due_at timestamptz, next_due_at timestamptz, search_first_reason text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  claimed  record;
  state    jsonb;
  issued   jsonb;
  tick_at  timestamptz := (SELECT s.now FROM billguard.scheduler_settings() s);
  trusted  interval := current_setting('billguard.idempotency_window')::interval;
BEGIN
  -- A failover must not lose a tick whose claims it replicated.
  PERFORM set_config('synchronous_commit', 'on', true);
  SELECT * INTO schedule FROM billguard.current_schedule();
  billing_period := schedule.due_period;
  due_at := schedule.due_at;
  next_due_at := schedule.next_due_at;
  initiated := 0;
  existing := 0;
  IF billguard.billing_database_problem() IS NOT NULL THEN
    outcome := 'not_billing_database';
    RETURN NEXT;
    RETURN;
  END IF;
  -- bill_period takes the same locks: the check and the claim are one step.
  -- The dispatcher waits for no lock: a session's open transaction must not
  -- halt all sending of this database.
  IF NOT pg_try_advisory_xact_lock(billguard.period_lock_class(), hashtext(schedule.due_period))
     OR NOT pg_try_advisory_xact_lock(billguard.scheduler_lock_class(), 0) THEN
    outcome := 'busy';
    RETURN NEXT;
    RETURN;
  END IF;
  state := billguard.entity_state('billing-scheduler');
  issued := state -> 'issued_periods';
  IF issued ? schedule.due_period THEN
    outcome := 'already_issued';
  ELSIF billguard.issued_after(schedule.due_period, state, tick_at) IS NOT NULL THEN
    outcome := 'passed';
  ELSE
    IF tick_at > schedule.due_at + trusted THEN
      search_first_reason := format(
        'the scheduler claimed %s %s after it became due (%s), past billguard.idempotency_window '
        '(%s): a charge made for it before (a restored backup that lost the tick) may have a key '
        'Stripe has forgotten',
        schedule.due_period, justify_hours(date_trunc('second', tick_at - schedule.due_at)),
        to_char(schedule.due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'),
        current_setting('billguard.idempotency_window'));
    END IF;
    SELECT * INTO claimed FROM billguard.claim_period(schedule.due_period, search_first_reason);
    initiated := claimed.initiated;
    existing := claimed.already_completed + claimed.in_progress + claimed.failed + claimed.cancelled;
    outcome := CASE WHEN initiated = 0 AND existing > 0 THEN 'already_billed' ELSE 'billed' END;
    IF initiated = 0 THEN
      search_first_reason := NULL;   -- no record carries it
    END IF;
  END IF;
  RETURN NEXT;
END $$;

-- The due periods never issued, oldest first: every period from the first
-- one issued (or, with none, due_period) up to due_period, the most recent
-- one due; none when the first one issued is later than due_period (the
-- calendar went back behind it, see issued_after()).
CREATE FUNCTION billguard.never_issued(due_period text, issued jsonb)
  RETURNS text[]
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT coalesce(array_agg(to_char(m, 'YYYY-MM') ORDER BY m), '{}')
            FROM generate_series(
                   to_date(coalesce((SELECT min(i.p) FROM jsonb_array_elements_text(issued) AS i(p)),
                                    due_period),
                           'YYYY-MM'),
                   to_date(due_period, 'YYYY-MM'), interval '1 month') AS m
           WHERE NOT issued ? to_char(m, 'YYYY-MM'));

-- The periods issued whose month has not ended at `at` (UTC): a clock that
-- ran ahead (stepped a month forward, then back) billed them early, and
-- accounts added since were not billed for them; or a person billed them in
-- advance. A bill_day moved later is no such case: the month had ended. A
-- clock stepped back across a month's end after the tick lists the period
-- too, until its month has ended again by that clock: by the clock now it
-- was issued early.
CREATE FUNCTION billguard.issued_early(issued jsonb, at timestamptz)
  RETURNS text[]
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT coalesce(array_agg(i.period ORDER BY i.period), '{}')
            FROM jsonb_array_elements_text(coalesce(issued, '[]'::jsonb)) AS i(period)
           WHERE i.period COLLATE "C" >= to_char(at AT TIME ZONE 'UTC', 'YYYY-MM'));

-- The due periods never issued, with the instant each became due. scheduled:
-- the scheduler bills it by itself (the most recent, with auto_bill =
-- monthly, unless a later period was issued: see issued_after()); it never
-- bills the others: bill each deliberately with bill_period. records counts
-- what bill_customer claimed of it already. issued_early: a period issued
-- before its month ended (see issued_early()), listed until it has: once
-- it is due, bill_period bills the accounts added since.
CREATE FUNCTION billguard.due_periods()
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

-- The scheduler as billguard.scheduler_status shows it: enabled, the next
-- instant it bills (in the past while the most recent due period waits to be
-- issued), the last period issued and when, how many due periods the
-- scheduler will not bill by itself (see due_periods()), why it bills
-- nothing now (this database is a copy or a restore not adopted, it shares
-- its namespace, its tick waits for a lock) and how many periods were
-- issued before their month ended (see issued_early()).
CREATE FUNCTION billguard.scheduler_state(
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

CREATE VIEW billguard.scheduler_status AS
SELECT s.enabled, s.bill_day, s.bill_hour_utc, s.next_bill_at, s.last_period_issued,
       s.last_period_issued_at, s.missed_periods, s.pause_reason, s.issued_early
  FROM billguard.scheduler_state() s;
COMMENT ON VIEW billguard.scheduler_status IS
  'The scheduler of this database: enabled, when it bills next, the last period issued, older due periods never issued, why it bills nothing now, periods issued early.';
