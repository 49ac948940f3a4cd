-- Cancels the record of (customer_id, billing_period) if it was never sent
-- (pending and never claimed by a dispatcher, or below_minimum); cancelling
-- a cancelled record again changes nothing. Its period amount may then be
-- corrected, and the record claimed again (reclaim_record). Wakes nothing.
CREATE OR REPLACE FUNCTION billguard.cancel_record(customer_id text, billing_period text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  PERFORM billguard.check_billing_period(cancel_record.billing_period);
  SELECT * INTO rec FROM billguard.billing_records r
   WHERE r.customer_id = cancel_record.customer_id AND r.billing_period = cancel_record.billing_period
     FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no billing record for % in %', quote_literal(left(cancel_record.customer_id, 64)),
                    cancel_record.billing_period
      USING ERRCODE = 'no_data_found';
  END IF;
  IF rec.status = 'cancelled' THEN
    RETURN 'cancelled';
  END IF;
  IF rec.status = 'below_minimum' THEN
    UPDATE billguard.billing_records r SET status = 'cancelled', updated_at = now()
     WHERE r.idempotency_key = rec.idempotency_key;
    PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingCancelled',
      jsonb_build_object('previous_status', rec.status, 'reason', 'cancel_record', 'by', session_user));
    RETURN 'cancelled';
  END IF;
  IF rec.status <> 'pending' OR rec.first_dispatched_at IS NOT NULL THEN
    RAISE EXCEPTION 'billing record %/% cannot be cancelled: it is %, so it may already have charged the customer',
                    rec.customer_id, rec.billing_period,
                    rec.status || coalesce(' and was first sent to Stripe at ' || rec.first_dispatched_at, '')
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Only a record that was never sent can be cancelled. Let this one reach its '
                   'outcome, and refund a completed charge in Stripe.';
  END IF;
  PERFORM billguard.cancel_unsent(rec.customer_id, rec.billing_period, 'cancel_record');
  RETURN 'cancelled';
END $$;
COMMENT ON FUNCTION billguard.cancel_record(text, text) IS
  'Cancels a billing record that was never sent to Stripe; refuses one that may have been (22023).';
