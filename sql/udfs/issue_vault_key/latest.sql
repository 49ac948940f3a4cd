CREATE OR REPLACE FUNCTION billguard.issue_vault_key(vendor text, billing_period text, period_usd_cap numeric,
                                          allowed_endpoints text[], expires_at timestamptz,
                                          livemode boolean DEFAULT true,
                                          issuer_max_period_usd numeric DEFAULT NULL,
                                          issuer_max_key_days integer DEFAULT NULL,
                                          issuer_period_months integer DEFAULT NULL)
  RETURNS TABLE (vault_key text, key_id text, cap_usd numeric, vendor text)
  LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT k.secret, k.new_key_id, round(k.cap_cents / 100.0, 2), issue_vault_key.vendor
      FROM billguard.vault_issue_key(issue_vault_key.vendor, issue_vault_key.billing_period,
                                     issue_vault_key.period_usd_cap, issue_vault_key.allowed_endpoints,
                                     issue_vault_key.expires_at, issue_vault_key.livemode,
                                     issue_vault_key.issuer_max_period_usd,
                                     issue_vault_key.issuer_max_key_days,
                                     issue_vault_key.issuer_period_months) k;
  END;
COMMENT ON FUNCTION billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean, numeric, integer, integer) IS
  'A new vault key (vk_live_/vk_test_ + 32 base62, returned once) spending the period''s budget; 23505 when the budget has another cap; with issuer_max_period_usd (the issuer token''s request) 42501 beyond vendor stripe, the charge endpoints, that ceiling for a new budget, a key living past issuer_max_key_days (100) or a period more than issuer_period_months (1) from the current one.';
