-- currency and period_cap (in that currency's major unit) ask for a budget
-- in any currency of billguard.currencies; period_usd_cap stays a cap in
-- USD. stripe_accounts: the connected accounts the key's budget may spend
-- on besides the platform's own. A request with any issuer_* argument is
-- the issuer token's; issuer_max_period is its ceiling for a new budget in
-- the currency (for USD, issuer_max_period_usd when it is NULL).
CREATE OR REPLACE FUNCTION billguard.issue_vault_key(vendor text, billing_period text, period_usd_cap numeric,
                                          allowed_endpoints text[], expires_at timestamptz,
                                          livemode boolean DEFAULT true,
                                          issuer_max_period_usd numeric DEFAULT NULL,
                                          issuer_max_key_days integer DEFAULT NULL,
                                          issuer_period_months integer DEFAULT NULL,
                                          currency text DEFAULT 'usd',
                                          period_cap numeric DEFAULT NULL,
                                          stripe_accounts text[] DEFAULT '{}',
                                          issuer_max_period numeric DEFAULT NULL)
  RETURNS TABLE (vault_key text, key_id text, cap_usd numeric, vendor text, currency text, cap numeric,
                 cap_cents bigint, stripe_accounts text[])
  LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT k.secret, k.new_key_id,
           CASE WHEN issue_vault_key.currency = 'usd' THEN round(k.cap_cents / 100.0, 2) END,
           issue_vault_key.vendor, issue_vault_key.currency,
           (SELECT round(k.cap_cents / 10::numeric ^ m.minor_units, m.minor_units)
              FROM billguard.currencies m WHERE m.code = issue_vault_key.currency),
           k.cap_cents, k.budget_accounts
      FROM billguard.vault_key_caps(issue_vault_key.currency, issue_vault_key.period_usd_cap,
                                    issue_vault_key.period_cap, issue_vault_key.issuer_max_period_usd,
                                    issue_vault_key.issuer_max_period) c,
           billguard.vault_issue_key(issue_vault_key.vendor, issue_vault_key.billing_period,
                                     issue_vault_key.currency, c.cap, issue_vault_key.allowed_endpoints,
                                     issue_vault_key.expires_at, issue_vault_key.livemode,
                                     issue_vault_key.stripe_accounts,
                                     num_nonnulls(issue_vault_key.issuer_max_period_usd,
                                                  issue_vault_key.issuer_max_period,
                                                  issue_vault_key.issuer_max_key_days,
                                                  issue_vault_key.issuer_period_months) > 0,
                                     c.issuer_max_cap, issue_vault_key.issuer_max_key_days,
                                     issue_vault_key.issuer_period_months) k;
  END;
COMMENT ON FUNCTION billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean, numeric, integer, integer, text, numeric, text[], numeric) IS
  'A new vault key (vk_live_/vk_test_ + 32 base62, returned once) spending the period''s budget in its currency; 23505 when the budget has another cap; as the issuer token''s request 42501 beyond vendor stripe, the charge endpoints, the ceiling for a new budget in the currency (none: no new budget), a key living past issuer_max_key_days (100) or a period more than issuer_period_months (1) from the current one.';
