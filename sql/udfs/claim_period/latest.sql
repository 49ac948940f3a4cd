-- The work of bill_period(); PL/pgSQL cannot name an input and an output
-- column alike, as bill_period's public signature does. The scheduler's
-- tick passes search_first_reason when it claims late (see scheduler_tick()):
-- each record it claims is searched for at Stripe before it is sent.
-- Each active account is claimed with its period amount (amount, currency,
-- description, metadata) when it has one, else with its fixed amount; a
-- usage-only account without a period amount is not claimed. An amount of
-- zero or under Stripe's minimum for its currency is claimed as
-- below_minimum: recorded and journaled, never sent (the rule is
-- is_below_minimum(), written out here as a join for a million rows).
CREATE OR REPLACE FUNCTION billguard.claim_period(period text, search_first_reason text DEFAULT NULL)
  RETURNS TABLE (initiated bigint, already_completed bigint, in_progress bigint, failed bigint,
                 cancelled bigint, below_minimum bigint)
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
  PERFORM billguard.check_claim_isolation('bill_period');

  -- Claims of one period are serialised: bill_period holds the period's
  -- lock exclusively, bill_customer holds it shared. Once we have it, every
  -- earlier claim is committed and visible to the next statement, so a plain
  -- set-based INSERT of the accounts without a record claims each exactly
  -- once; no per-row speculative insertion, no row-order deadlocks.
  PERFORM pg_advisory_xact_lock(billguard.period_lock_class(), hashtext(period));
  BEGIN
    WITH claimed AS (
      INSERT INTO billguard.billing_records AS r
             (customer_id, billing_period, idempotency_key, status, next_attempt_at, amount_cents,
              currency, stripe_customer, payment_method, search_first_reason, description,
              metadata, stripe_account, application_fee_cents)
      SELECT a.customer_id, period, billguard.idempotency_key(a.customer_id, period, ns),
             CASE WHEN c.below THEN 'below_minimum' ELSE 'pending' END,
             CASE WHEN c.below THEN NULL ELSE now() END,
             c.amount_cents, c.currency, a.stripe_customer, a.payment_method,
             claim_period.search_first_reason, p.description, p.metadata, a.stripe_account,
             a.application_fee_cents
        FROM billguard.accounts a
        LEFT JOIN billguard.period_amounts p
          ON p.customer_id = a.customer_id AND p.billing_period = period
       CROSS JOIN LATERAL (SELECT coalesce(p.amount_cents, a.amount_cents) AS amount_cents,
                                  CASE WHEN p.customer_id IS NULL THEN a.currency
                                       ELSE p.currency END AS currency) m
        LEFT JOIN billguard.currencies cur ON cur.code = m.currency
       CROSS JOIN LATERAL (SELECT m.amount_cents, m.currency,
                                  (m.amount_cents = 0
                                   OR (m.amount_cents < cur.min_charge_units) IS TRUE) AS below) c
       WHERE a.active
         AND m.amount_cents IS NOT NULL
         AND NOT EXISTS (SELECT FROM billguard.billing_records e
                          WHERE e.customer_id = a.customer_id AND e.billing_period = period)
      RETURNING r.customer_id, r.idempotency_key, r.status, r.amount_cents, r.currency, r.created_at
    ), journaled AS (
      INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
      SELECT 'billing-' || c.customer_id || '-' || period, 1, c.customer_id, 'BillingInitiated',
             billguard.billing_initiated_event(c.customer_id, period, c.idempotency_key,
                                               c.amount_cents, c.currency, c.created_at)
        FROM claimed c
      UNION ALL
      SELECT 'billing-' || c.customer_id || '-' || period, 2, c.customer_id, 'BillingBelowMinimum',
             billguard.below_minimum_event(c.amount_cents, c.currency)
        FROM claimed c
       WHERE c.status = 'below_minimum'
    )
    SELECT count(*) FILTER (WHERE c.status = 'pending') INTO initiated FROM claimed c;
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
         count(*) FILTER (WHERE r.status = 'cancelled'),
         count(*) FILTER (WHERE r.status = 'below_minimum')
    INTO already_completed, in_progress, failed, cancelled, below_minimum
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
