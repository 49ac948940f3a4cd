-- Requeues every record of a period in one status, failed or needs_review
-- (after an outage, or once a cause is fixed); returns how many.
CREATE OR REPLACE FUNCTION billguard.retry_period(billing_period text, status text)
  RETURNS bigint
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  rec billguard.billing_records;
  n   bigint := 0;
BEGIN
  PERFORM billguard.check_billing_period(retry_period.billing_period);
  IF retry_period.status IS NULL OR retry_period.status NOT IN ('failed', 'needs_review') THEN
    RAISE EXCEPTION 'retry_period requeues failed or needs_review records, not %',
                    coalesce(quote_literal(left(retry_period.status, 40)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  FOR rec IN SELECT * FROM billguard.billing_records r
              WHERE r.billing_period = retry_period.billing_period AND r.status = retry_period.status
              ORDER BY r.idempotency_key
                FOR UPDATE
  LOOP
    PERFORM billguard.requeue_record(rec);
    n := n + 1;
  END LOOP;
  IF n > 0 THEN
    PERFORM billguard.wake_dispatcher();
  END IF;
  RETURN n;
END $$;
