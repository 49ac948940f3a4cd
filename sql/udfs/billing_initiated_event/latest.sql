-- The BillingInitiated event written with every new billing record.
CREATE FUNCTION billguard.billing_initiated_event(customer_id text, billing_period text,
                                                  idempotency_key text, amount_cents bigint,
                                                  currency text, initiated_at timestamptz,
                                                  request_id text DEFAULT NULL)
  RETURNS jsonb
  LANGUAGE c STABLE PARALLEL SAFE   -- initiated_at is rendered in the session's TimeZone
  AS 'MODULE_PATHNAME', 'billguard_billing_initiated_event';
