-- Claims a cancelled record that was never sent again, with what the
-- customer owes for the period now (its period amount, else the account's
-- amount), as bill_customer would claim it: the documented correction of
-- a period amount frozen by a claim (cancel_record, change the amount,
-- reclaim_record). The record keeps its key, which Stripe has never seen:
-- no dispatcher ever claimed it (first_dispatched_at and the stored request
-- are NULL, which billing_records_frozen_identity requires of this change).
-- Returns the new status, pending or below_minimum.
CREATE OR REPLACE FUNCTION billguard.reclaim_record(customer_id text, billing_period text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  rec     billguard.billing_records;
  account billguard.accounts;
  charge  record;
BEGIN
  PERFORM billguard.check_billing_period(reclaim_record.billing_period);
  PERFORM billguard.check_claim_isolation('reclaim_record');
  -- bill_customer's locks, in its order (see there).
  PERFORM pg_advisory_xact_lock_shared(billguard.period_lock_class(),
                                       hashtext(reclaim_record.billing_period));
  SELECT * INTO account FROM billguard.accounts a
   WHERE a.customer_id = reclaim_record.customer_id FOR UPDATE;
  SELECT * INTO rec FROM billguard.billing_records r
   WHERE r.customer_id = reclaim_record.customer_id AND r.billing_period = reclaim_record.billing_period
     FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no billing record for % in %', quote_literal(left(reclaim_record.customer_id, 64)),
                    reclaim_record.billing_period
      USING ERRCODE = 'no_data_found';
  END IF;
  IF rec.status <> 'cancelled' THEN
    RAISE EXCEPTION 'billing record %/% is %: only a cancelled record can be claimed again',
                    rec.customer_id, rec.billing_period, rec.status
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'A record never sent is cancelled first: billguard.cancel_record.';
  END IF;
  IF rec.first_dispatched_at IS NOT NULL OR rec.request_body IS NOT NULL THEN
    RAISE EXCEPTION 'billing record %/% cannot be claimed again: a dispatcher claimed it at %, so Stripe may know its key',
                    rec.customer_id, rec.billing_period, coalesce(rec.first_dispatched_at::text, 'an unknown time')
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Refund what it charged in Stripe, or bill the difference in the next period.';
  END IF;
  IF account.customer_id IS NULL OR NOT account.active THEN
    RAISE EXCEPTION 'billing record %/% cannot be claimed again: its account is %', rec.customer_id,
                    rec.billing_period, CASE WHEN account.customer_id IS NULL THEN 'gone' ELSE 'not active' END
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT * INTO charge FROM billguard.period_charge(account, rec.billing_period);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'customer % has nothing to bill for %: its account is usage-only (amount_cents NULL) and billguard.period_amounts has no amount for the period',
                    quote_literal(rec.customer_id), rec.billing_period
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  UPDATE billguard.billing_records r
     SET status = charge.status, amount_cents = charge.amount_cents, currency = charge.currency,
         description = charge.description, metadata = charge.metadata,
         stripe_customer = account.stripe_customer, payment_method = account.payment_method,
         stripe_account = account.stripe_account,
         application_fee_cents = account.application_fee_cents,
         attempts = 0, unknown_cycles = NULL, last_error = NULL,
         next_attempt_at = CASE WHEN charge.status = 'pending' THEN now() END, updated_at = now()
   WHERE r.idempotency_key = rec.idempotency_key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingReclaimed',
    jsonb_build_object('status', charge.status, 'amount_cents', charge.amount_cents,
                       'currency', charge.currency, 'previous_amount_cents', rec.amount_cents,
                       'previous_currency', rec.currency, 'by', session_user));
  IF charge.status = 'pending' THEN
    PERFORM billguard.wake_dispatcher();
  END IF;
  RETURN charge.status;
END $$;
COMMENT ON FUNCTION billguard.reclaim_record(text, text) IS
  'Claims a cancelled, never-sent billing record again with what the customer owes now; refuses one a dispatcher ever claimed (22023).';
