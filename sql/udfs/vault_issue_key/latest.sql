-- The work of issue_vault_key(); PL/pgSQL cannot name an input and an
-- output column alike, as issue_vault_key's public signature does. cap is
-- the budget's cap in the currency's smallest unit; stripe_accounts the
-- connected accounts the key's request names, which join its budget's.
-- issuer: the issuer token's request, bounded by issuer_max_cap (the
-- operator's ceiling for a new budget in this currency, NULL when it set
-- none: the issuer token may then create no budget in it).
CREATE OR REPLACE FUNCTION billguard.vault_issue_key(vendor text, billing_period text, currency text,
                                          cap bigint, allowed_endpoints text[], expires_at timestamptz,
                                          livemode boolean, stripe_accounts text[], issuer boolean,
                                          issuer_max_cap bigint, issuer_max_key_days integer,
                                          issuer_period_months integer)
  RETURNS TABLE (secret text, new_key_id text, cap_cents bigint, budget_accounts text[])
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  budget  billguard.vault_budgets;
  -- The issuer's bounds on a key's life and on the periods it names; the
  -- documented defaults when the caller passes none.
  max_days   integer := coalesce(issuer_max_key_days, 100);
  max_months integer := coalesce(issuer_period_months, 1);
  months_away integer;
  accounts text[];
  cap_text text := billguard.minor_units_text(cap, currency);
BEGIN
  IF vendor IS NULL OR vendor !~ '^[a-z][a-z0-9_]{0,39}$' THEN
    RAISE EXCEPTION 'vendor must be 1..40 lower-case letters, digits or _ (e.g. stripe), got %',
                    coalesce(quote_literal(left(vendor, 40)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM billguard.check_billing_period(billing_period);
  IF cap_text IS NULL OR cap IS NULL OR cap NOT BETWEEN 1 AND 1000000000000000 THEN
    RAISE EXCEPTION 'the cap must be a positive amount in a currency of billguard.currencies, got % %',
                    coalesce(cap::text, 'NULL'), coalesce(quote_literal(left(currency, 16)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF NOT billguard.are_vault_endpoints(allowed_endpoints) THEN
    RAISE EXCEPTION 'allowed_endpoints must be 1..20 API paths such as /v1/payment_intents, got %',
                    coalesce(left(allowed_endpoints::text, 200), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  accounts := ARRAY(SELECT DISTINCT a COLLATE "C" FROM unnest(stripe_accounts) a ORDER BY 1);
  IF stripe_accounts IS NULL OR NOT billguard.are_stripe_accounts(accounts) THEN
    RAISE EXCEPTION 'stripe_accounts must be 0..100 connected account ids such as acct_1Nv0FGQ9RKHgCVdK, got %',
                    coalesce(left(stripe_accounts::text, 200), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF expires_at IS NULL OR expires_at <= now() THEN
    RAISE EXCEPTION 'expires_at must be in the future, got %', coalesce(expires_at::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF livemode IS NULL OR issuer IS NULL THEN
    RAISE EXCEPTION 'livemode and issuer must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;

  -- The issuer token's request: the dispatcher's, never more. Its key
  -- (vault_key_request) is for vendor stripe and the charge endpoints and
  -- their search, and it creates a budget only up to the operator's
  -- ceiling for the currency (none set: no budget at all). Where the
  -- period's budget exists, the cap check below applies as to the admin:
  -- another cap is 409 naming the budget's, and joining at it raises
  -- nothing, so a budget an admin made larger than the ceiling is still
  -- joined. The issuer is who the cap guards against (billing software, a
  -- compromised billing database): another vendor name, other endpoints
  -- or a larger new budget are the admin's.
  IF issuer THEN
    IF max_days NOT BETWEEN 1 AND 36500 OR max_months NOT BETWEEN 0 AND 1200 THEN
      RAISE EXCEPTION 'issuer_max_key_days must be 1..36500 and issuer_period_months 0..1200, got % and %',
                      max_days, max_months
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF vendor <> 'stripe' THEN
      RAISE EXCEPTION 'the issuer token may ask for vendor stripe only, not %', quote_literal(vendor)
        USING ERRCODE = 'insufficient_privilege', HINT = 'Have an admin issue this key.';
    END IF;
    IF NOT allowed_endpoints <@ ARRAY['/v1/payment_intents', '/v1/payment_intents/search',
                                      '/v1/charges', '/v1/charges/search'] THEN
      RAISE EXCEPTION 'the issuer token may ask for /v1/payment_intents, /v1/charges and their /search only, not %',
                      array_to_string(allowed_endpoints, ', ')
        USING ERRCODE = 'insufficient_privilege', HINT = 'Have an admin issue this key.';
    END IF;
    IF NOT EXISTS (SELECT FROM billguard.vault_budgets b
                    WHERE (b.vendor, b.billing_period, b.currency)
                        = (vault_issue_key.vendor, vault_issue_key.billing_period, vault_issue_key.currency)) THEN
      IF issuer_max_cap IS NULL THEN
        RAISE EXCEPTION 'the issuer token may create no budget in % (the proxy has no ceiling for it: --issuer-max-period AMOUNT:%)',
                        upper(currency), currency
          USING ERRCODE = 'insufficient_privilege',
                HINT = 'Have an admin create the period''s budget (POST /keys with the admin token), or give the proxy a ceiling for the currency.';
      ELSIF cap > issuer_max_cap THEN
        RAISE EXCEPTION 'the issuer token may create a budget of at most % (%), not % for billing_period %',
                        billguard.minor_units_text(issuer_max_cap, currency),
                        CASE WHEN currency = 'usd' THEN '--issuer-max-period-usd'
                             ELSE '--issuer-max-period' END,
                        cap_text, billing_period
          USING ERRCODE = 'insufficient_privilege',
                HINT = 'Have an admin create the period''s budget (POST /keys with the admin token), or raise the ceiling.';
      END IF;
    END IF;
    -- A key that never expires, or one for any period the issuer names
    -- (opening its budget, or joining an old one with room left), would
    -- outlive or outreach what the dispatcher needs: its key lives 35 days
    -- past the later of its period's end and now, and it bills the period
    -- just ended (or the current one). The operator widens both.
    IF expires_at > now() + make_interval(days => max_days) THEN
      RAISE EXCEPTION 'the issuer token may ask for a key that expires within % days (--issuer-max-key-days), not at %',
                      max_days, expires_at
        USING ERRCODE = 'insufficient_privilege', HINT = 'Ask for an earlier expires_at, or have an admin issue this key.';
    END IF;
    months_away := abs((split_part(billing_period, '-', 1)::integer * 12 + split_part(billing_period, '-', 2)::integer)
                       - (extract(year FROM now() AT TIME ZONE 'UTC')::integer * 12
                          + extract(month FROM now() AT TIME ZONE 'UTC')::integer));
    IF months_away > max_months THEN
      RAISE EXCEPTION 'the issuer token may ask for billing periods within % month(s) of the current one (%, --issuer-period-months), not %',
                      max_months, to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM'), billing_period
        USING ERRCODE = 'insufficient_privilege', HINT = 'Have an admin issue this key, or widen --issuer-period-months.';
    END IF;
  END IF;

  INSERT INTO billguard.vault_budgets AS b (vendor, billing_period, currency, cap_cents)
  VALUES (vendor, billing_period, currency, cap)
  ON CONFLICT DO NOTHING;
  SELECT * INTO STRICT budget FROM billguard.vault_budgets b
   WHERE (b.vendor, b.billing_period, b.currency)
       = (vault_issue_key.vendor, vault_issue_key.billing_period, vault_issue_key.currency)
     FOR UPDATE;
  -- The proxy reads the budget's cap back from this message (the 409's
  -- cap_cents): written with exactly the currency's decimals, its digits
  -- are the cap in the currency's smallest unit.
  IF budget.cap_cents <> cap THEN
    RAISE EXCEPTION 'billing_period % of % already has a cap of %', billing_period,
                    vendor, billguard.minor_units_text(budget.cap_cents, currency)
      USING ERRCODE = 'unique_violation',
            DETAIL = 'A second key of a period joins its budget and never changes its cap.',
            HINT = 'Ask with the same cap, or have an admin raise the cap.';
  END IF;
  -- The accounts a key names join its budget's: they widen where the cap
  -- may be spent, never the cap.
  IF NOT accounts <@ budget.stripe_accounts THEN
    UPDATE billguard.vault_budgets b
       SET stripe_accounts = ARRAY(SELECT DISTINCT a COLLATE "C"
                                     FROM unnest(b.stripe_accounts || accounts) a ORDER BY 1),
           updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (budget.vendor, budget.billing_period, budget.currency)
    RETURNING b.stripe_accounts INTO budget.stripe_accounts;
  END IF;

  secret := CASE WHEN livemode THEN 'vk_live_' ELSE 'vk_test_' END || billguard.random_base62(32);
  new_key_id := 'vkey_' || billguard.random_base62(16);
  cap_cents := cap;
  budget_accounts := budget.stripe_accounts;
  INSERT INTO billguard.vault_keys (key_id, secret_sha256, vendor, billing_period, currency,
                                    allowed_endpoints, livemode, expires_at)
  VALUES (new_key_id, sha256(convert_to(secret, 'UTF8')), vendor, billing_period, currency,
          allowed_endpoints, livemode, expires_at);

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, currency, decision, reason)
  VALUES (new_key_id, vendor, billing_period, currency, 'issued',
          format('cap %s, endpoints %s, expires %s%s', cap_text,
                 array_to_string(allowed_endpoints, ' '), expires_at,
                 CASE WHEN cardinality(accounts) > 0
                      THEN ', connected accounts ' || array_to_string(accounts, ' ') ELSE '' END));

  -- The scheduler entity records every key issued; the advisory lock
  -- serialises appends to it, as bill_period's do.
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  PERFORM billguard.append_event('billing-scheduler', billguard.highest_seq_nr('billing-scheduler'),
                                 'VaultKeyIssued',
                                 jsonb_build_object('billing_period', billing_period,
                                                    'key_id', new_key_id, 'vendor', vendor)
                                 || CASE WHEN currency = 'usd' THEN jsonb_build_object('cap_usd', round(cap / 100.0, 2))
                                         ELSE jsonb_build_object('currency', currency, 'cap_cents', cap) END);
  RETURN NEXT;
END $$;
