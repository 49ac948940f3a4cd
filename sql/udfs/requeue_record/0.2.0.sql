-- Requeues a locked record: pending, attempts 0, no unknown cycles, due
-- now, journaled. It keeps its key, its stored request and its first
-- dispatch time, so a record older than the idempotency window is searched
-- for at Stripe before anything is re-sent.
CREATE OR REPLACE FUNCTION billguard.requeue_record(rec billguard.billing_records) RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  UPDATE billguard.billing_records r
     SET status = 'pending', attempts = 0, unknown_cycles = NULL, next_attempt_at = now(),
         updated_at = now()
   WHERE r.idempotency_key = rec.idempotency_key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'RecordRequeued',
    jsonb_build_object('previous_status', rec.status, 'last_error', rec.last_error,
                       'by', session_user));
END $$;
