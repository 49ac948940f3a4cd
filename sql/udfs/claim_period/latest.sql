-- The work of bill_period(); PL/pgSQL cannot name an input and an output
-- column alike, as bill_period's public signature does. The scheduler's
-- tick passes search_first_reason when it claims late (see scheduler_tick()):
-- each record it claims is searched for at Stripe before it is sent.
CREATE OR REPLACE FUNCTION billguard.claim_period(period text, search_first_reason text DEFAULT NULL)
  RETURNS TABLE (initiated bigint, already_completed bigint, in_progress bigint, failed bigint,
                 cancelled bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  -- The anti-join below reads billing_records while the same statement
  -- inserts into it; planned as a nested loop over a seq scan (likely while
  -- the table is new and unanalysed) it would rescan the growing table per
  -- account. Hash and merge joins keep a large period linear.
  SET enable_nestloop = off
  AS $$
#variable_conflict use_column
DECLARE
  ns        text := billguard.key_namespace();
  scheduler_state jsonb;
BEGIN
  PERFORM billguard.check_billing_period(period);

  -- Claims of one period are serialised: bill_period holds the period's
  -- lock exclusively, bill_customer holds it shared. Once we have it, every
  -- earlier claim is committed and visible to the next statement, so a plain
  -- set-based INSERT of the accounts without a record claims each exactly
  -- once; no per-row speculative insertion, no row-order deadlocks.
  PERFORM pg_advisory_xact_lock(billguard.period_lock_class(), hashtext(period));
  BEGIN
    WITH claimed AS (
      INSERT INTO billguard.billing_records AS r
             (customer_id, billing_period, idempotency_key, amount_cents, currency,
              stripe_customer, payment_method, search_first_reason, stripe_account,
              application_fee_cents)
      SELECT a.customer_id, period, billguard.idempotency_key(a.customer_id, period, ns),
             a.amount_cents, a.currency, a.stripe_customer, a.payment_method,
             claim_period.search_first_reason, a.stripe_account, a.application_fee_cents
        FROM billguard.accounts a
       WHERE a.active AND a.amount_cents IS NOT NULL
         AND NOT EXISTS (SELECT FROM billguard.billing_records e
                          WHERE e.customer_id = a.customer_id AND e.billing_period = period)
      RETURNING r.customer_id, r.idempotency_key, r.amount_cents, r.currency, r.created_at
    ), journaled AS (
      INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
      SELECT 'billing-' || c.customer_id || '-' || period, 1, c.customer_id, 'BillingInitiated',
             billguard.billing_initiated_event(c.customer_id, period, c.idempotency_key,
                                               c.amount_cents, c.currency, c.created_at)
        FROM claimed c
      RETURNING 1
    )
    SELECT count(*) INTO initiated FROM journaled;
  EXCEPTION WHEN unique_violation THEN
    -- Only a REPEATABLE READ / SERIALIZABLE caller whose snapshot predates
    -- another claim gets here; nothing of this call is kept.
    RAISE EXCEPTION 'billing records of % were claimed concurrently; retry the transaction', period
      USING ERRCODE = 'serialization_failure';
  END;

  -- Every record of the period (others' claims committed before we took the
  -- lock), whatever its account has become since: period_status's counts.
  SELECT count(*) FILTER (WHERE r.status = 'completed'),
         count(*) FILTER (WHERE r.status IN ('pending', 'dispatching', 'unknown', 'needs_review')),
         count(*) FILTER (WHERE r.status IN ('failed', 'blocked')),
         count(*) FILTER (WHERE r.status = 'cancelled')
    INTO already_completed, in_progress, failed, cancelled
    FROM billguard.billing_records r
   WHERE r.billing_period = period;
  in_progress := in_progress - initiated;   -- our own claims are pending too

  -- The first time a period is billed, the scheduler entity records it,
  -- and whether its month had ended by the scheduler's clock: the scheduler
  -- never goes back behind such a period, whatever its clock says later
  -- (see issued_after()). The advisory lock serialises appends to that one
  -- entity.
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  scheduler_state := billguard.entity_state('billing-scheduler');
  IF NOT (scheduler_state -> 'issued_periods') ? period THEN
    PERFORM billguard.append_event('billing-scheduler', (scheduler_state ->> 'seq_nr')::bigint,
                                   'BillingTickIssued',
                                   jsonb_build_object('billing_period', period,
                                                      'issued_at', clock_timestamp(),
                                                      'month_ended', period COLLATE "C" < to_char(
                                                        (SELECT s.now FROM billguard.scheduler_settings() s)
                                                          AT TIME ZONE 'UTC', 'YYYY-MM')));
  END IF;

  IF initiated > 0 THEN
    PERFORM billguard.wake_dispatcher();
  END IF;
  RETURN NEXT;
END $$;
