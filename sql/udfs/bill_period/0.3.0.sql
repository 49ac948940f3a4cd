CREATE OR REPLACE FUNCTION billguard.bill_period(billing_period text)
  RETURNS TABLE (billing_period text, initiated bigint, already_completed bigint,
                 in_progress bigint, failed bigint, cancelled bigint, below_minimum bigint)
  LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT bill_period.billing_period, c.initiated, c.already_completed, c.in_progress, c.failed,
           c.cancelled, c.below_minimum
      FROM billguard.claim_period(bill_period.billing_period) c;
  END;
COMMENT ON FUNCTION billguard.bill_period(text) IS
  'Claims and queues one charge per active account for the period (its period amount, else its fixed amount); idempotent and safe to run concurrently.';
