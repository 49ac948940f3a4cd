-- A period amount is what its record charges once the record is claimed
-- (any status but cancelled): the claim froze it, and the dispatcher sends
-- that request for good under the record's key. A change or a delete
-- afterwards is refused, naming the record; an insert only when it says
-- something else than the record charges (a restore loads the rows as they
-- were frozen). The race with a claim is decided by locks, so the loser is
-- told rather than silently ignored: bill_period holds the period's lock
-- exclusively (taken here shared), bill_customer the account's row
-- FOR UPDATE (taken here FOR KEY SHARE, as the foreign key does, but before
-- the record is looked at). Either the claim waits for this transaction
-- and reads what it wrote, or this waits for the claim and sees its record.
-- That needs a snapshot per statement: READ COMMITTED only.
-- Also the rule Stripe has for three-decimal currencies (the last digit
-- of the amount is 0), which a CHECK cannot see through the currency.
-- SECURITY DEFINER: whoever writes period amounts need not read
-- billing_records or lock accounts.
CREATE OR REPLACE FUNCTION billguard.refuse_frozen_period_amount() RETURNS trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  pa     billguard.period_amounts;
  frozen record;
  claimed bigint;
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    SELECT count(*) INTO claimed FROM billguard.period_amounts p
     WHERE EXISTS (SELECT FROM billguard.billing_records r
                    WHERE r.customer_id = p.customer_id AND r.billing_period = p.billing_period
                      AND r.status <> 'cancelled');
    IF claimed > 0 THEN
      RAISE EXCEPTION 'billguard.period_amounts cannot be truncated: billing records claimed % of its rows', claimed
        USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NULL;
  END IF;
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'billguard.period_amounts is written in READ COMMITTED transactions, not %',
                    current_setting('transaction_isolation')
      USING ERRCODE = 'invalid_transaction_state',
            DETAIL = 'A claim committed after this transaction''s snapshot would be invisible to it: the amount could change under a record already claimed.';
  END IF;
  IF TG_OP = 'INSERT' OR TG_OP = 'UPDATE' THEN
    IF NEW.amount_cents % 10 <> 0
       AND (SELECT c.minor_units FROM billguard.currencies c WHERE c.code = NEW.currency) = 3 THEN
      RAISE EXCEPTION 'period amount of % for %: % is in %, a three-decimal currency, so its last digit must be 0',
                      quote_literal(NEW.customer_id), NEW.billing_period, NEW.amount_cents, NEW.currency
        USING ERRCODE = 'check_violation',
              HINT = 'Stripe takes three-decimal amounts rounded to a multiple of 10 minor units.';
    END IF;
  END IF;
  -- The rows this write takes away from their records: the old one of an
  -- update or a delete, then the new one of an insert or an update.
  FOREACH pa IN ARRAY CASE TG_OP WHEN 'INSERT' THEN ARRAY[NEW]
                                 WHEN 'DELETE' THEN ARRAY[OLD]
                                 ELSE ARRAY[OLD, NEW] END
  LOOP
    PERFORM pg_advisory_xact_lock_shared(billguard.period_lock_class(), hashtext(pa.billing_period));
    PERFORM FROM billguard.accounts a WHERE a.customer_id = pa.customer_id FOR KEY SHARE;
    SELECT r.idempotency_key, r.status, r.amount_cents, r.currency, r.description,
           coalesce(r.metadata, '{}') AS metadata
      INTO frozen
      FROM billguard.billing_records r
     WHERE r.customer_id = pa.customer_id AND r.billing_period = pa.billing_period
       AND r.status <> 'cancelled';
    CONTINUE WHEN NOT FOUND;
    CONTINUE WHEN TG_OP <> 'DELETE'
              AND (pa.customer_id, pa.billing_period) = (NEW.customer_id, NEW.billing_period)
              AND (NEW.amount_cents, NEW.currency, NEW.description, NEW.metadata)
                  IS NOT DISTINCT FROM
                  (frozen.amount_cents, frozen.currency, frozen.description, frozen.metadata);
    RAISE EXCEPTION 'period amount of % for % is frozen: billing record % claimed it and is %',
                    quote_literal(pa.customer_id), pa.billing_period, frozen.idempotency_key,
                    frozen.status
      USING ERRCODE = 'restrict_violation',
            DETAIL = format('The record charges %s %s, as it was claimed; %s of its period amount is refused.',
                            frozen.amount_cents, frozen.currency, lower(TG_OP)),
            HINT = CASE WHEN frozen.status IN ('pending', 'below_minimum')
                        THEN 'If it was never sent: billguard.cancel_record, change the period amount, then billguard.reclaim_record.'
                        ELSE 'It may have been sent: refund it in Stripe, or bill the difference in the next period.' END;
  END LOOP;
  RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END $$;
