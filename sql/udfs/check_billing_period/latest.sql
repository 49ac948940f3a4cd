-- Raises 22023 unless billing_period is a valid YYYY-MM; the one place the
-- message is worded.
CREATE OR REPLACE FUNCTION billguard.check_billing_period(billing_period text) RETURNS void
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF billing_period IS NULL OR NOT billguard.is_billing_period(billing_period) THEN
    RAISE EXCEPTION 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got %',
                    coalesce(quote_literal(left(billing_period, 40)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
END $$;
