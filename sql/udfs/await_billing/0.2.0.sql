-- The outcome of (customer_id, billing_period): its status and charge id as
-- soon as the record is terminal, or ('in_progress', NULL) once `timeout`
-- has passed. Each pass reads the record with a fresh snapshot (READ
-- COMMITTED) after reading its wake-up count, so the commit that makes it
-- terminal is never missed. Where no commit could ever show this caller a
-- change, it refuses to wait rather than sleep for nothing: in a REPEATABLE
-- READ or SERIALIZABLE transaction (its snapshot is fixed), when the caller's
-- own open transaction wrote the record (no one else can finish it before it
-- commits), and without shared_preload_libraries (no dispatcher runs and no
-- commit is announced). A terminal record, or timeout 0, is answered in all
-- of these.
CREATE OR REPLACE FUNCTION billguard.await_billing(customer_id text, billing_period text,
                                        timeout interval DEFAULT '30 s')
  RETURNS TABLE (status text, charge_id text)
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  customer text := await_billing.customer_id;
  period   text := await_billing.billing_period;
  deadline timestamptz;
  seen     bigint;
  rec      record;
BEGIN
  IF customer IS NULL THEN
    RAISE EXCEPTION 'customer_id must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM billguard.check_billing_period(period);
  IF await_billing.timeout IS NULL OR await_billing.timeout < interval '0' THEN
    RAISE EXCEPTION 'timeout must be an interval of zero or more, got %',
                    coalesce(await_billing.timeout::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  deadline := clock_timestamp() + await_billing.timeout;
  LOOP
    seen := billguard.terminal_commits(customer, period);
    SELECT r.status, r.charge_id, r.xmin AS row_xmin INTO rec
      FROM billguard.billing_records r
     WHERE r.customer_id = customer AND r.billing_period = period;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'no billing record for % in %', quote_literal(left(customer, 64)), period
        USING ERRCODE = 'no_data_found',
              HINT = 'bill_customer() or bill_period() claims it; await_billing() only waits.';
    END IF;
    IF billguard.is_terminal_status(rec.status) THEN
      RETURN QUERY SELECT rec.status, rec.charge_id;
      RETURN;
    END IF;
    IF clock_timestamp() >= deadline THEN
      RETURN QUERY SELECT 'in_progress'::text, NULL::text;
      RETURN;
    END IF;
    IF seen IS NULL THEN
      RAISE EXCEPTION 'await_billing cannot wait: billguard is not in shared_preload_libraries'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'Without it no dispatcher runs; timeout 0 reads the status without waiting.';
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      RAISE EXCEPTION 'await_billing cannot wait in a % transaction: its snapshot never shows the record change',
                      upper(current_setting('transaction_isolation'))
        USING ERRCODE = 'invalid_transaction_state',
              HINT = 'Call it in READ COMMITTED, or with timeout 0 to read the status this snapshot shows.';
    END IF;
    IF billguard.written_by_this_transaction(rec.row_xmin) THEN
      RAISE EXCEPTION 'await_billing cannot wait: this transaction wrote the billing record of % in % and has not committed',
                      quote_literal(left(customer, 64)), period
        USING ERRCODE = 'invalid_transaction_state',
              HINT = 'Commit the bill_customer() call first, then await_billing() in a new transaction.';
    END IF;
    PERFORM billguard.await_terminal_commit(customer, period, seen, deadline);
  END LOOP;
END $$;
COMMENT ON FUNCTION billguard.await_billing(text, text, interval) IS
  'Waits for the billing of (customer_id, billing_period) to end: (status, charge_id) once terminal, (in_progress, NULL) at the timeout.';
