-- Billing records name their account by customer_id alone (a foreign key
-- would tax every claim of bill_period). Once an account has records, a new
-- id for it, by UPDATE or by DELETE and INSERT, is a new customer to
-- bill_period, billed again for the periods it has already paid.
-- The Stripe account a record charges on (and its application fee) is
-- frozen in it: while one may still be sent, the account's connected
-- account and fee do not change either, or a correction an operator makes
-- by cancelling and claiming again would land on another account than the
-- one Stripe may already know the key on.
-- SECURITY DEFINER: whoever maintains accounts need not read billing_records.
CREATE OR REPLACE FUNCTION billguard.refuse_billed_account_change() RETURNS trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  billed bigint;
  unsettled record;
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    SELECT count(*) INTO billed FROM billguard.accounts a
     WHERE EXISTS (SELECT FROM billguard.billing_records r WHERE r.customer_id = a.customer_id);
    IF billed > 0 THEN
      RAISE EXCEPTION 'billguard.accounts cannot be truncated: % accounts have billing records', billed
        USING ERRCODE = 'restrict_violation',
              HINT = 'Deactivate them instead: UPDATE billguard.accounts SET active = false.';
    END IF;
    RETURN NULL;
  END IF;
  IF TG_OP = 'UPDATE' AND NEW.customer_id = OLD.customer_id THEN
    IF (NEW.stripe_account, NEW.application_fee_cents)
       IS DISTINCT FROM (OLD.stripe_account, OLD.application_fee_cents) THEN
      SELECT r.billing_period, r.idempotency_key, r.status INTO unsettled
        FROM billguard.billing_records r
       WHERE r.customer_id = OLD.customer_id
         AND r.status IN ('pending', 'dispatching', 'unknown', 'needs_review')
       ORDER BY r.billing_period
       LIMIT 1;
      IF FOUND THEN
        RAISE EXCEPTION 'account % has a billing record in flight (%, key %, %): its stripe_account and application_fee_cents do not change until it settles',
                        quote_literal(OLD.customer_id), unsettled.billing_period,
                        unsettled.idempotency_key, unsettled.status
          USING ERRCODE = 'restrict_violation',
                DETAIL = 'The record charges on the account it was claimed for; Stripe keeps idempotency keys per account.',
                HINT = 'Let the record settle (or cancel_record it if it was never sent), then change the account.';
      END IF;
    END IF;
    RETURN NEW;
  END IF;
  IF EXISTS (SELECT FROM billguard.billing_records r WHERE r.customer_id = OLD.customer_id) THEN
    RAISE EXCEPTION 'account % has billing records: %', quote_literal(OLD.customer_id),
                    CASE TG_OP WHEN 'UPDATE' THEN 'its customer_id never changes'
                                              ELSE 'it is never deleted' END
      USING ERRCODE = 'restrict_violation',
            DETAIL = 'Under another id the same customer would be billed again for the periods already billed.',
            HINT = 'Deactivate it instead: UPDATE billguard.accounts SET active = false.';
  END IF;
  RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END $$;
