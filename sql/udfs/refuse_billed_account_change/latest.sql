-- Billing records name their account by customer_id alone (a foreign key
-- would tax every claim of bill_period). Once an account has records, a new
-- id for it, by UPDATE or by DELETE and INSERT, is a new customer to
-- bill_period, billed again for the periods it has already paid.
-- SECURITY DEFINER: whoever maintains accounts need not read billing_records.
CREATE OR REPLACE FUNCTION billguard.refuse_billed_account_change() RETURNS trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  billed bigint;
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
