-- Cancels the never-sent records of customer_id (of one period, or of every
-- period when billing_period is NULL), each with a BillingCancelled event;
-- returns how many. The UPDATE locks each row: a record a dispatcher is
-- claiming at this moment is read again once that claim commits, and then
-- no longer matches.
CREATE OR REPLACE FUNCTION billguard.cancel_unsent(customer_id text, billing_period text, reason text)
  RETURNS bigint
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec record;
  cancelled bigint := 0;
BEGIN
  FOR rec IN
    UPDATE billguard.billing_records r SET status = 'cancelled', next_attempt_at = NULL, updated_at = now()
     WHERE r.customer_id = cancel_unsent.customer_id
       AND (cancel_unsent.billing_period IS NULL OR r.billing_period = cancel_unsent.billing_period)
       AND r.status = 'pending' AND r.first_dispatched_at IS NULL
    RETURNING r.customer_id, r.billing_period
  LOOP
    PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingCancelled',
      jsonb_build_object('previous_status', 'pending', 'reason', reason, 'by', session_user));
    cancelled := cancelled + 1;
  END LOOP;
  RETURN cancelled;
END $$;
