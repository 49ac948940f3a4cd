-- Amounts in different currencies are never added up: a status gets one row
-- per currency its records are in. A status without records still gets its
-- row (count 0, amount 0), whose currency is NULL, so every status is
-- always listed.
CREATE OR REPLACE FUNCTION billguard.period_status(billing_period text)
  RETURNS TABLE (status text, count bigint, amount_cents numeric, currency text)
  LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  PERFORM billguard.check_billing_period(period_status.billing_period);
  RETURN QUERY
    -- sum(bigint) is numeric: no total overflows, whatever amounts records
    -- claimed before amounts were capped hold.
    SELECT st.status, count(r.status), coalesce(sum(r.amount_cents), 0), r.currency
      FROM unnest(ARRAY['pending', 'dispatching', 'unknown', 'needs_review', 'completed',
                        'failed', 'blocked', 'cancelled', 'below_minimum']) WITH ORDINALITY AS st (status, position)
      LEFT JOIN billguard.billing_records r
        ON r.status = st.status AND r.billing_period = period_status.billing_period
     GROUP BY st.status, st.position, r.currency
     ORDER BY st.position, r.currency;
END $$;
COMMENT ON FUNCTION billguard.period_status(text) IS
  'One row per record status and currency for the period: how many records, and their amount in minor units of that currency (never a sum across currencies). A status without records has one row with count 0, amount 0 and currency NULL.';
