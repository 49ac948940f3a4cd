-- Marks a reviewed record completed with the charge a person found; a
-- record's charge id is set once.
CREATE OR REPLACE FUNCTION billguard.resolve_record(customer_id text, billing_period text, charge_id text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  IF resolve_record.charge_id IS NULL OR resolve_record.charge_id !~ '^(pi|ch)_[A-Za-z0-9_]+$' THEN
    RAISE EXCEPTION 'charge_id must be a Stripe id (pi_... or ch_...)'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  rec := billguard.record_for_operator(resolve_record.customer_id, resolve_record.billing_period,
                                       ARRAY['needs_review', 'failed', 'unknown'], 'resolved');
  IF rec.charge_id IS NOT NULL THEN
    RAISE EXCEPTION 'billing record %/% already has charge %: a charge id never changes',
                    rec.customer_id, rec.billing_period, rec.charge_id
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  UPDATE billguard.billing_records r
     SET status = 'completed', charge_id = resolve_record.charge_id, completed_at = now(),
         last_error = NULL, next_attempt_at = NULL, updated_at = now()
   WHERE r.idempotency_key = rec.idempotency_key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ReviewResolved',
    jsonb_build_object('charge_id', resolve_record.charge_id, 'previous_status', rec.status,
                       'by', session_user));
  RETURN 'completed';
END $$;
