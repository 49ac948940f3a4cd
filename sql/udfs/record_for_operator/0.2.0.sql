-- The record of (customer_id, billing_period), locked, if its status is one
-- of `allowed`; otherwise a clear error naming what `action` needs.
CREATE OR REPLACE FUNCTION billguard.record_for_operator(customer_id text, billing_period text,
                                              allowed text[], action text)
  RETURNS billguard.billing_records
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec billguard.billing_records;
  n   int := cardinality(allowed);
BEGIN
  PERFORM billguard.check_billing_period(record_for_operator.billing_period);
  SELECT * INTO rec FROM billguard.billing_records r
   WHERE r.customer_id = record_for_operator.customer_id
     AND r.billing_period = record_for_operator.billing_period
     FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no billing record for % in %',
                    quote_literal(left(record_for_operator.customer_id, 64)),
                    record_for_operator.billing_period
      USING ERRCODE = 'no_data_found';
  END IF;
  IF rec.status <> ALL (allowed) THEN
    RAISE EXCEPTION 'billing record %/% is %, only % or % records can be %',
                    rec.customer_id, rec.billing_period, rec.status,
                    array_to_string(allowed[1:n - 1], ', '), allowed[n], action
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN rec;
END $$;
