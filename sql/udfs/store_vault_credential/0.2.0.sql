-- Keeps the key the proxy answered; a newer key of the period replaces the
-- one it had (an expired one, say).
CREATE OR REPLACE FUNCTION billguard.store_vault_credential(api_base text, billing_period text, currency text,
                                                 key_id text, vault_key text, cap_cents bigint)
  RETURNS void
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    INSERT INTO billguard.vault_credentials AS c
           (api_base, billing_period, currency, key_id, vault_key, cap_cents)
    VALUES (store_vault_credential.api_base, store_vault_credential.billing_period,
            store_vault_credential.currency, store_vault_credential.key_id,
            store_vault_credential.vault_key, store_vault_credential.cap_cents)
    ON CONFLICT (api_base, billing_period, currency) DO UPDATE
       SET key_id = excluded.key_id, vault_key = excluded.vault_key,
           cap_cents = excluded.cap_cents, obtained_at = now();
  END;
