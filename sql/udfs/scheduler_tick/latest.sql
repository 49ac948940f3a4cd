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
CREATE OR REPLACE FUNCTION billguard.scheduler_tick()
  RETURNS TABLE (billing_period text, outcome text, initiated bigint, existing bigint,
                 due_at timestamptz, next_due_at timestamptz, search_first_reason text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  claimed  record;
  below_now bigint;
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
    -- claim_period counts the below_minimum records of the period, this
    -- claim's (created by this transaction, at now()) and earlier ones.
    SELECT count(*) INTO below_now FROM billguard.billing_records r
     WHERE r.billing_period = schedule.due_period AND r.status = 'below_minimum' AND r.created_at = now();
    existing := claimed.already_completed + claimed.in_progress + claimed.failed + claimed.cancelled
                + claimed.below_minimum - below_now;
    outcome := CASE WHEN initiated = 0 AND below_now = 0 AND existing > 0 THEN 'already_billed'
                    ELSE 'billed' END;
    IF initiated = 0 THEN
      search_first_reason := NULL;   -- no record carries it
    END IF;
  END IF;
  RETURN NEXT;
END $$;
