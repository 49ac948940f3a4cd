-- Claims (customer, period) once: with its period amount when there is
-- one, else the account's fixed amount; an amount of zero or under Stripe's
-- minimum is claimed below_minimum and never sent. The locks, in this
-- order: the period's, shared (exclusive against bill_period), then the
-- account's row FOR UPDATE, which a write of the customer's period amount
-- waits for (and the other way round): the amount read after them is the
-- one the record freezes.
CREATE OR REPLACE FUNCTION billguard.bill_customer(customer_id text, billing_period text,
                                        request_id text DEFAULT NULL)
  RETURNS TABLE (status text, idempotency_key text, charge_id text)
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  customer text := bill_customer.customer_id;
  period   text := bill_customer.billing_period;
  key      text;
  existing record;
  account  billguard.accounts;
  charge   record;
  claimed_at timestamptz;
BEGIN
  IF customer IS NULL THEN
    RAISE EXCEPTION 'customer_id must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM billguard.check_billing_period(period);
  IF octet_length(bill_customer.request_id) > 255 THEN
    RAISE EXCEPTION 'request_id must be at most 255 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  key := billguard.idempotency_key(customer, period);   -- also validates customer_id

  -- Guards 1 and 2: completed, in progress, or terminal. The record answers.
  SELECT r.status, r.idempotency_key, r.charge_id INTO existing
    FROM billguard.billing_records r
   WHERE r.customer_id = customer AND r.billing_period = period;
  IF FOUND THEN
    RETURN QUERY SELECT billguard.caller_status(existing.status), existing.idempotency_key,
                        existing.charge_id;
    RETURN;
  END IF;
  PERFORM billguard.check_claim_isolation('bill_customer');

  -- Shared with other single claims, exclusive against bill_period (see there).
  PERFORM pg_advisory_xact_lock_shared(billguard.period_lock_class(), hashtext(period));
  SELECT * INTO account FROM billguard.accounts a WHERE a.customer_id = customer FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'customer % is not in billguard.accounts', quote_literal(left(customer, 64))
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  IF NOT account.active THEN
    RAISE EXCEPTION 'customer % is not active', quote_literal(customer)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT * INTO charge FROM billguard.period_charge(account, period);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'customer % has nothing to bill for %: its account is usage-only (amount_cents NULL) and billguard.period_amounts has no amount for the period',
                    quote_literal(customer), period
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Write the period amount first (billguard.period_amounts), then bill the customer.';
  END IF;

  -- The pre-flight claim. A concurrent caller that got there first makes
  -- this insert wait for its commit and then do nothing. No arbiter is
  -- named: the same claim conflicts on the key (billing_records_pk) as well
  -- as on (customer_id, billing_period), and both must mean "taken".
  INSERT INTO billguard.billing_records AS r
         (customer_id, billing_period, idempotency_key, status, next_attempt_at, amount_cents,
          currency, stripe_customer, payment_method, request_id, description, metadata,
          stripe_account, application_fee_cents)
  VALUES (customer, period, key, charge.status,
          CASE WHEN charge.status = 'pending' THEN now() END, charge.amount_cents,
          charge.currency, account.stripe_customer, account.payment_method,
          bill_customer.request_id, charge.description, charge.metadata, account.stripe_account,
          account.application_fee_cents)
  ON CONFLICT DO NOTHING
  RETURNING r.created_at INTO claimed_at;
  IF NOT FOUND THEN
    SELECT r.status, r.idempotency_key, r.charge_id INTO STRICT existing
      FROM billguard.billing_records r
     WHERE r.customer_id = customer AND r.billing_period = period;
    RETURN QUERY SELECT billguard.caller_status(existing.status), existing.idempotency_key,
                        existing.charge_id;
    RETURN;
  END IF;

  -- The record is new, so its entity has no events yet: seq_nr 1.
  INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
  VALUES ('billing-' || customer || '-' || period, 1, customer, 'BillingInitiated',
          billguard.billing_initiated_event(customer, period, key, charge.amount_cents,
                                            charge.currency, claimed_at, bill_customer.request_id));
  IF charge.status = 'below_minimum' THEN
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    VALUES ('billing-' || customer || '-' || period, 2, customer, 'BillingBelowMinimum',
            billguard.below_minimum_event(charge.amount_cents, charge.currency));
    RETURN QUERY SELECT 'below_minimum'::text, key, NULL::text;
    RETURN;
  END IF;
  PERFORM billguard.wake_dispatcher();
  RETURN QUERY SELECT 'initiated'::text, key, NULL::text;
END $$;
COMMENT ON FUNCTION billguard.bill_customer(text, text, text) IS
  'Claims (customer_id, billing_period) once and queues its charge; always answers, never creates a second record.';
