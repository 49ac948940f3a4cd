-- One step of the fold. Pure: the same events always give the same state.
CREATE OR REPLACE FUNCTION billguard.apply_event(state jsonb, event_type text, event jsonb) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE event_type
    WHEN 'BillingInitiated' THEN state || jsonb_build_object(
      'status', 'in_progress',
      'customer_id', event -> 'customer_id',
      'billing_period', event -> 'billing_period',
      'idempotency_key', event -> 'idempotency_key',
      'amount_cents', event -> 'amount_cents',
      'currency', event -> 'currency',
      'initiated_at', event -> 'initiated_at')
    WHEN 'ChargeAttempted' THEN state || jsonb_build_object(
      'attempts', coalesce(event -> 'attempt', to_jsonb(coalesce((state ->> 'attempts')::int, 0) + 1)))
    WHEN 'BillingCompleted' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ChargeReconciled' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ReviewResolved' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'BillingFailed' THEN state || jsonb_build_object(
      'status', CASE WHEN (event ->> 'terminal')::boolean THEN 'failed' ELSE state ->> 'status' END,
      'last_error', event - 'terminal')
    WHEN 'ChargeUnknown' THEN state || jsonb_build_object('status', 'unknown')
    WHEN 'NeedsReview' THEN state || jsonb_build_object('status', 'needs_review')
    WHEN 'BillingBlocked' THEN state || jsonb_build_object('status', 'blocked')
    WHEN 'RecordRequeued' THEN state || jsonb_build_object('status', 'in_progress')
    WHEN 'BillingCancelled' THEN state || jsonb_build_object('status', 'cancelled')
    WHEN 'BillingBelowMinimum' THEN state || jsonb_build_object('status', 'below_minimum')
    -- A cancelled record never sent, claimed again with what is owed now.
    WHEN 'BillingReclaimed' THEN state || jsonb_build_object(
      'status', CASE WHEN event ->> 'status' = 'below_minimum' THEN 'below_minimum'
                     ELSE 'in_progress' END,
      'amount_cents', event -> 'amount_cents',
      'currency', event -> 'currency')
    WHEN 'WebhookApplied' THEN state || jsonb_strip_nulls(jsonb_build_object(
      'status', CASE WHEN event ->> 'effect' IN ('completed', 'refunded') THEN 'completed'
                     WHEN event ->> 'effect' = 'failed' THEN 'failed' END,
      'charge_id', CASE WHEN event ->> 'effect' IN ('completed', 'refunded') THEN event -> 'charge_id' END,
      -- Stripe's amount refunded so far only grows; its events come in any order.
      'refunded_cents', CASE WHEN event ->> 'effect' = 'refunded'
                             THEN to_jsonb(greatest((state ->> 'refunded_cents')::bigint,
                                                    (event ->> 'amount_refunded_cents')::bigint)) END))
    WHEN 'BillingTickIssued' THEN jsonb_set(state, '{issued_periods}',
      CASE WHEN (state -> 'issued_periods') ? (event ->> 'billing_period')
           THEN state -> 'issued_periods'
           ELSE coalesce(state -> 'issued_periods', '[]'::jsonb) || jsonb_build_array(event -> 'billing_period')
      END)
      || CASE WHEN event ->> 'billing_period' >= coalesce(state ->> 'last_issued_period', '')
              THEN jsonb_build_object('last_issued_period', event -> 'billing_period',
                                      'last_issued_at', event -> 'issued_at')
              ELSE '{}'::jsonb
         END
      -- Events before 0.2.0 do not say: their periods count by the clock now.
      || CASE WHEN coalesce((event ->> 'month_ended')::boolean, false)
                   AND NOT coalesce(state -> 'ended_when_issued', '[]'::jsonb) ? (event ->> 'billing_period')
              THEN jsonb_build_object('ended_when_issued',
                     coalesce(state -> 'ended_when_issued', '[]'::jsonb) || jsonb_build_array(event -> 'billing_period'))
              ELSE '{}'::jsonb
         END
    ELSE state
  END || jsonb_build_object('last_event_type', event_type);
