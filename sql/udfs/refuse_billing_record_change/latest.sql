-- A billing record is a financial fact: deleting it would let the same
-- (customer, period) be claimed again with a fresh history, and changing
-- what identifies the charge would break "same key, same parameters". The
-- stored request and the charge id may be set once, never changed.
CREATE OR REPLACE FUNCTION billguard.refuse_billing_record_change() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND OLD.charge_id IS NOT NULL AND OLD.charge_id IS DISTINCT FROM NEW.charge_id THEN
    RAISE EXCEPTION 'billing record %/% already has charge %: a charge id never changes',
                    OLD.customer_id, OLD.billing_period, OLD.charge_id
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  IF TG_OP = 'UPDATE'
     AND ((OLD.stripe_endpoint IS NOT NULL AND OLD.stripe_endpoint IS DISTINCT FROM NEW.stripe_endpoint)
          OR (OLD.request_body IS NOT NULL AND OLD.request_body IS DISTINCT FROM NEW.request_body)) THEN
    RAISE EXCEPTION 'billing record %/%: the request sent to Stripe never changes once stored',
                    OLD.customer_id, OLD.billing_period
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  IF TG_OP = 'UPDATE' THEN
    RAISE EXCEPTION 'billing record %/% : customer, period, key, amount and payee never change',
                    OLD.customer_id, OLD.billing_period
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  RAISE EXCEPTION 'billguard.billing_records rows are never removed: % refused', TG_OP
    USING ERRCODE = 'integrity_constraint_violation';
END $$;
