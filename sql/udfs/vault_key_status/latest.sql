-- A key and its budget, for the proxy's admin: cap_cents and the sums in
-- the currency's smallest unit; cap_usd for a budget in USD only.
CREATE OR REPLACE FUNCTION billguard.vault_key_status(key_id text)
  RETURNS TABLE (vendor text, billing_period text, currency text, cap_usd numeric,
                 cap_cents bigint, settled_cents bigint, reserved_cents bigint,
                 remaining_cents bigint, allowed_endpoints text[], livemode boolean,
                 expires_at timestamptz, revoked_at timestamptz, created_at timestamptz)
  LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
    SELECT k.vendor, k.billing_period, k.currency,
           CASE WHEN k.currency = 'usd' THEN round(s.cap_cents / 100.0, 2) END, s.cap_cents,
           s.settled_cents, s.reserved_cents, s.remaining_cents,
           k.allowed_endpoints, k.livemode, k.expires_at, k.revoked_at, k.created_at
      FROM billguard.vault_keys k
      JOIN billguard.vault_spend s USING (vendor, billing_period, currency)
     WHERE k.key_id = vault_key_status.key_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no vault key %', coalesce(quote_literal(left(vault_key_status.key_id, 40)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;
END $$;
