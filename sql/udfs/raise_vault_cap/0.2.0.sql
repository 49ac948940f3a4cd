-- Raises the cap of the budget a key spends. A cap is never lowered below
-- what it is (22023): revoke keys instead.
CREATE OR REPLACE FUNCTION billguard.raise_vault_cap(key_id text, period_usd_cap numeric) RETURNS numeric
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  cap    bigint := billguard.usd_to_cents(period_usd_cap);
  k      billguard.vault_keys;
  budget billguard.vault_budgets;
BEGIN
  SELECT * INTO k FROM billguard.vault_keys v WHERE v.key_id = raise_vault_cap.key_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no vault key %', coalesce(quote_literal(left(raise_vault_cap.key_id, 40)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;
  SELECT * INTO STRICT budget FROM billguard.vault_budgets b
   WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency)
     FOR UPDATE;
  IF cap < budget.cap_cents THEN
    RAISE EXCEPTION 'a cap is only ever raised: billing_period % has % USD, asked %',
                    k.billing_period, to_char(budget.cap_cents / 100.0, 'FM999999999999990.00'),
                    period_usd_cap
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF cap > budget.cap_cents THEN
    UPDATE billguard.vault_budgets b SET cap_cents = cap, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
    INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, currency, decision, reason)
    VALUES (k.key_id, k.vendor, k.billing_period, k.currency, 'cap_raised',
            format('cap raised from %s to %s USD', to_char(budget.cap_cents / 100.0, 'FM999999999999990.00'),
                   to_char(cap / 100.0, 'FM999999999999990.00')));
  END IF;
  RETURN round(cap / 100.0, 2);
END $$;
