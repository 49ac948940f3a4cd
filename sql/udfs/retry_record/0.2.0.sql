-- Requeues a failed or needs_review record deliberately.
CREATE OR REPLACE FUNCTION billguard.retry_record(customer_id text, billing_period text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM billguard.requeue_record(
    billguard.record_for_operator(retry_record.customer_id, retry_record.billing_period,
                                  ARRAY['failed', 'needs_review'], 'retried'));
  PERFORM billguard.wake_dispatcher();
  RETURN 'pending';
END $$;
