-- Withdrawing a billing that was never sent: by an operator (cancel_record)
-- or because its account was deactivated. Only a record no dispatcher ever
-- claimed is provably unsent; one that was claimed may have charged the
-- customer already, and must reach its outcome. The dispatcher claims only
-- pending, dispatching and unknown records, so a cancelled one is never sent.

-- Cancels the never-sent records of customer_id (of one period, or of every
-- period when billing_period is NULL), each with a BillingCancelled event;
-- returns how many. The UPDATE locks each row: a record a dispatcher is
-- claiming at this moment is read again once that claim commits, and then
-- no longer matches.
CREATE FUNCTION billguard.cancel_unsent(customer_id text, billing_period text, reason text)
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

-- Cancels the record of (customer_id, billing_period) if it was never sent;
-- cancelling a cancelled record again changes nothing. Wakes nothing.
CREATE FUNCTION billguard.cancel_record(customer_id text, billing_period text)
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

-- Deactivating an account withdraws its billings that were never sent.
-- SECURITY DEFINER: whoever maintains accounts need not write billing_records.
CREATE FUNCTION billguard.cancel_unsent_of_deactivated() RETURNS trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM billguard.cancel_unsent(NEW.customer_id, NULL::text, 'account deactivated');
  RETURN NULL;
END $$;

CREATE TRIGGER accounts_deactivated AFTER UPDATE OF active ON billguard.accounts
  FOR EACH ROW WHEN (OLD.active AND NOT NEW.active)
  EXECUTE FUNCTION billguard.cancel_unsent_of_deactivated();
-- Also when the apply worker of a subscription deactivates the account.
ALTER TABLE billguard.accounts ENABLE ALWAYS TRIGGER accounts_deactivated;
