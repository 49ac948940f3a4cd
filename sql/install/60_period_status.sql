-- What happened to a period, by status.

CREATE FUNCTION billguard.period_status(billing_period text)
  RETURNS TABLE (status text, count bigint, amount_cents numeric)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  PERFORM billguard.check_billing_period(period_status.billing_period);
  RETURN QUERY
    -- sum(bigint) is numeric: no total overflows, whatever amounts records
    -- claimed before amounts were capped hold.
    SELECT st.status, count(r.status), coalesce(sum(r.amount_cents), 0)
      FROM unnest(ARRAY['pending', 'dispatching', 'unknown', 'needs_review', 'completed',
                        'failed', 'blocked', 'cancelled']) WITH ORDINALITY AS st (status, position)
      LEFT JOIN billguard.billing_records r
        ON r.status = st.status AND r.billing_period = period_status.billing_period
     GROUP BY st.status, st.position
     ORDER BY st.position;
END $$;
COMMENT ON FUNCTION billguard.period_status(text) IS
  'One row per record status for the period: how many records, and their amount in minor units.';
