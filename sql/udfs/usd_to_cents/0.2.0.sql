-- A USD amount in cents, exactly (numeric, never floating point); 22023
-- unless it is positive whole cents within 10^15 cents, which keeps every
-- sum of a budget within bigint.
CREATE OR REPLACE FUNCTION billguard.usd_to_cents(usd numeric) RETURNS bigint
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF usd IS NULL OR usd <= 0 OR usd * 100 <> trunc(usd * 100) OR usd * 100 > 1e15 THEN
    RAISE EXCEPTION 'period_usd_cap must be a positive amount of whole cents up to 10000000000000, got %',
                    coalesce(usd::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN (usd * 100)::bigint;
END $$;
