-- Forgets a key the proxy no longer accepts (expired), unless a newer one
-- replaced it already.
CREATE OR REPLACE FUNCTION billguard.forget_vault_credential(api_base text, billing_period text,
                                                  currency text, key_id text)
  RETURNS void
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    DELETE FROM billguard.vault_credentials c
     WHERE (c.api_base, c.billing_period, c.currency, c.key_id)
         = (forget_vault_credential.api_base, forget_vault_credential.billing_period,
            forget_vault_credential.currency, forget_vault_credential.key_id);
  END;
