-- Billing every active account once for a period, set-based.

-- The work of bill_period(); PL/pgSQL cannot name an input and an output
-- column alike, as bill_period's public signature does.
CREATE FUNCTION billguard.claim_period(period text)
  RETURNS TABLE (initiated bigint, already_completed bigint, in_progress bigint, failed bigint)
  LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  ns        text := billguard.key_namespace();
  attempted bigint;
  scheduler_state jsonb;
BEGIN
  PERFORM billguard.check_billing_period(period);

  -- One statement: find accounts without a record, claim them in customer
  -- order (so concurrent callers wait on each other instead of deadlocking),
  -- journal exactly the claims that this call won, and count the rest.
  WITH accounts_in_period AS MATERIALIZED (
    SELECT a.customer_id, a.stripe_customer, a.amount_cents, a.currency, a.payment_method,
           r.status
      FROM billguard.accounts a
      LEFT JOIN billguard.billing_records r
        ON r.customer_id = a.customer_id AND r.billing_period = period
     WHERE a.active
  ), claimed AS (
    INSERT INTO billguard.billing_records AS r
           (customer_id, billing_period, idempotency_key, amount_cents, currency,
            stripe_customer, payment_method)
    SELECT c.customer_id, period, billguard.idempotency_key(c.customer_id, period, ns),
           c.amount_cents, c.currency, c.stripe_customer, c.payment_method
      FROM accounts_in_period c
     WHERE c.status IS NULL
     ORDER BY c.customer_id
    ON CONFLICT DO NOTHING   -- on the key or on (customer, period): see bill_customer
    RETURNING r.customer_id, r.idempotency_key, r.amount_cents, r.currency, r.created_at
  ), journaled AS (
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    SELECT 'billing-' || c.customer_id || '-' || period, 1, c.customer_id, 'BillingInitiated',
           jsonb_build_object('customer_id', c.customer_id, 'billing_period', period,
                              'idempotency_key', c.idempotency_key,
                              'amount_cents', c.amount_cents, 'currency', c.currency,
                              'initiated_at', c.created_at)
      FROM claimed c
    RETURNING 1
  )
  SELECT (SELECT count(*) FROM journaled),
         count(*) FILTER (WHERE s.status = 'completed'),
         count(*) FILTER (WHERE s.status IN ('pending', 'dispatching', 'unknown', 'needs_review')),
         count(*) FILTER (WHERE s.status IN ('failed', 'blocked')),
         count(*) FILTER (WHERE s.status IS NULL)
    INTO initiated, already_completed, in_progress, failed, attempted
    FROM accounts_in_period s;

  -- Claims lost to a concurrent caller are that caller's, still in progress.
  in_progress := in_progress + (attempted - initiated);

  -- The first time a period is billed, the scheduler entity records it.
  -- The advisory lock serialises appends to that one entity.
  PERFORM pg_advisory_xact_lock(hashtext('billguard'), hashtext('billing-scheduler'));
  scheduler_state := billguard.entity_state('billing-scheduler');
  IF NOT (scheduler_state -> 'issued_periods') ? period THEN
    PERFORM billguard.append_event('billing-scheduler', (scheduler_state ->> 'seq_nr')::bigint,
                                   'BillingTickIssued',
                                   jsonb_build_object('billing_period', period,
                                                      'issued_at', clock_timestamp()));
  END IF;

  IF initiated > 0 THEN
    PERFORM billguard.wake_dispatcher();
  END IF;
  RETURN NEXT;
END $$;

CREATE FUNCTION billguard.bill_period(billing_period text)
  RETURNS TABLE (billing_period text, initiated bigint, already_completed bigint,
                 in_progress bigint, failed bigint)
  LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT bill_period.billing_period, c.initiated, c.already_completed, c.in_progress, c.failed
      FROM billguard.claim_period(bill_period.billing_period) c;
  END;
COMMENT ON FUNCTION billguard.bill_period(text) IS
  'Claims and queues one charge per active account for the period; idempotent and safe to run concurrently.';
