-- Raises 25000 in a REPEATABLE READ or SERIALIZABLE transaction. A claim
-- reads the period amounts committed before it took its locks (see
-- refuse_frozen_period_amount()); a snapshot fixed earlier could miss one,
-- and the record would freeze an amount the table no longer says.
CREATE OR REPLACE FUNCTION billguard.check_claim_isolation(caller text) RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION '% claims in READ COMMITTED transactions, not %', caller,
                    current_setting('transaction_isolation')
      USING ERRCODE = 'invalid_transaction_state',
            DETAIL = 'It bills the period amounts committed when it runs, which a snapshot taken earlier may not show.';
  END IF;
END $$;
