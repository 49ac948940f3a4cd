-- An amount in a currency's smallest unit as people read it, with the
-- currency's decimals and code: 5500 usd is '55.00 USD', 5000 jpy
-- '5000 JPY', 1250 kwd '1.250 KWD'. For messages and the audit trail.
CREATE OR REPLACE FUNCTION billguard.minor_units_text(minor bigint, currency text) RETURNS text
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT round(minor / 10::numeric ^ c.minor_units, c.minor_units)::text || ' ' || upper(c.code)
            FROM billguard.currencies c WHERE c.code = minor_units_text.currency);
