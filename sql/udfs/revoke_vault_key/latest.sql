-- Revokes a key: its very next request is refused (401). Revoking again
-- changes nothing and answers the first revocation's time.
CREATE OR REPLACE FUNCTION billguard.revoke_vault_key(key_id text) RETURNS timestamptz
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  k billguard.vault_keys;
BEGIN
  UPDATE billguard.vault_keys v SET revoked_at = coalesce(v.revoked_at, now())
   WHERE v.key_id = revoke_vault_key.key_id
  RETURNING * INTO k;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no vault key %', coalesce(quote_literal(left(revoke_vault_key.key_id, 40)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, currency, decision, reason)
  VALUES (k.key_id, k.vendor, k.billing_period, k.currency, 'revoked',
          format('revoked at %s', k.revoked_at));
  RETURN k.revoked_at;
END $$;
