-- An amount in a currency's major unit (10.50 EUR, 5000 JPY, 1.250 KWD) in
-- its smallest unit, exactly (numeric, never floating point), by the minor
-- units billguard.currencies gives it; 22023 unless the currency is known
-- and the amount positive, whole in its smallest unit and within 10^15 of
-- them, which keeps every sum of a budget within bigint. `what` names the
-- amount in the message (period_cap, say).
CREATE OR REPLACE FUNCTION billguard.to_minor_units(amount numeric, currency text, what text)
  RETURNS bigint
  LANGUAGE plpgsql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  scale numeric;
BEGIN
  SELECT 10::numeric ^ c.minor_units INTO scale FROM billguard.currencies c
   WHERE c.code = to_minor_units.currency;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'currency must be a lower-case ISO 4217 code of billguard.currencies, got %',
                    coalesce(quote_literal(left(currency, 16)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF amount IS NULL OR amount <= 0 OR amount * scale <> trunc(amount * scale) OR amount * scale > 1e15 THEN
    RAISE EXCEPTION '% must be a positive amount of whole % (% decimals) up to % %, got %',
                    what, upper(currency), log(scale)::integer, (1e15 / scale)::bigint, upper(currency),
                    coalesce(amount::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN (amount * scale)::bigint;
END $$;
