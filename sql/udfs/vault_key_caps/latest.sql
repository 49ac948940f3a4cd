-- The caps of a POST /keys in the currency's smallest unit: the one asked
-- (period_usd_cap, in USD only, or period_cap in the currency, not both)
-- and the issuer token's ceiling for a new budget in the currency
-- (issuer_max_period, or for USD --issuer-max-period-usd's
-- issuer_max_period_usd; NULL when the operator set none). 22023 on a cap
-- that is not exact in the currency's minor units.
CREATE OR REPLACE FUNCTION billguard.vault_key_caps(currency text, period_usd_cap numeric, period_cap numeric,
                                         issuer_max_period_usd numeric, issuer_max_period numeric)
  RETURNS TABLE (cap bigint, issuer_max_cap bigint)
  LANGUAGE plpgsql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF (period_usd_cap IS NULL) = (period_cap IS NULL) THEN
    RAISE EXCEPTION 'a key asks for one cap: period_usd_cap (USD) or period_cap (in its currency), got %',
                    CASE WHEN period_cap IS NULL THEN 'neither' ELSE 'both' END
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF period_usd_cap IS NOT NULL AND currency IS DISTINCT FROM 'usd' THEN
    RAISE EXCEPTION 'period_usd_cap is a cap in USD: a budget in % takes period_cap', coalesce(upper(left(currency, 16)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  cap := CASE WHEN period_usd_cap IS NOT NULL THEN billguard.usd_to_cents(period_usd_cap)
              ELSE billguard.to_minor_units(period_cap, currency, 'period_cap') END;
  issuer_max_cap := CASE
    WHEN issuer_max_period IS NOT NULL THEN billguard.to_minor_units(issuer_max_period, currency, 'issuer_max_period')
    WHEN currency = 'usd' AND issuer_max_period_usd IS NOT NULL THEN billguard.usd_to_cents(issuer_max_period_usd)
  END;
  RETURN NEXT;
END $$;
