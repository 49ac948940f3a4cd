-- Raises the cap of the budget a key spends, to period_usd_cap in the
-- budget's currency (USD for a budget in USD, its name since 0.1.0; EUR
-- for one in EUR, exact in the currency's minor units). A cap is never
-- lowered below what it is (22023): revoke keys instead. Answers the cap
-- in the currency's major unit.
CREATE OR REPLACE FUNCTION billguard.raise_vault_cap(key_id text, period_usd_cap numeric) RETURNS numeric
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  cap    bigint;
  k      billguard.vault_keys;
  budget billguard.vault_budgets;
BEGIN
  SELECT * INTO k FROM billguard.vault_keys v WHERE v.key_id = raise_vault_cap.key_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no vault key %', coalesce(quote_literal(left(raise_vault_cap.key_id, 40)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;
  cap := CASE WHEN k.currency = 'usd' THEN billguard.usd_to_cents(period_usd_cap)
              ELSE billguard.to_minor_units(period_usd_cap, k.currency, 'period_cap') END;
  SELECT * INTO STRICT budget FROM billguard.vault_budgets b
   WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency)
     FOR UPDATE;
  IF cap < budget.cap_cents THEN
    RAISE EXCEPTION 'a cap is only ever raised: billing_period % has %, asked %',
                    k.billing_period, billguard.minor_units_text(budget.cap_cents, k.currency),
                    period_usd_cap
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF cap > budget.cap_cents THEN
    UPDATE billguard.vault_budgets b SET cap_cents = cap, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
    INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, currency, decision, reason)
    VALUES (k.key_id, k.vendor, k.billing_period, k.currency, 'cap_raised',
            format('cap raised from %s to %s', left(billguard.minor_units_text(budget.cap_cents, k.currency), -4),
                   billguard.minor_units_text(cap, k.currency)));
  END IF;
  RETURN (SELECT round(cap / 10::numeric ^ c.minor_units, c.minor_units)
            FROM billguard.currencies c WHERE c.code = k.currency);
END $$;
