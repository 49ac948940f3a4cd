-- The work of issue_vault_key(); PL/pgSQL cannot name an input and an
-- output column alike, as issue_vault_key's public signature does.
CREATE OR REPLACE FUNCTION billguard.vault_issue_key(vendor text, billing_period text, period_usd_cap numeric,
                                          allowed_endpoints text[], expires_at timestamptz,
                                          livemode boolean, issuer_max_period_usd numeric,
                                          issuer_max_key_days integer, issuer_period_months integer)
  RETURNS TABLE (secret text, new_key_id text, cap_cents bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  cap     bigint := billguard.usd_to_cents(period_usd_cap);
  budget  billguard.vault_budgets;
  -- The issuer's bounds on a key's life and on the periods it names; the
  -- documented defaults when the caller passes none.
  max_days   integer := coalesce(issuer_max_key_days, 100);
  max_months integer := coalesce(issuer_period_months, 1);
  months_away integer;
BEGIN
  IF vendor IS NULL OR vendor !~ '^[a-z][a-z0-9_]{0,39}$' THEN
    RAISE EXCEPTION 'vendor must be 1..40 lower-case letters, digits or _ (e.g. stripe), got %',
                    coalesce(quote_literal(left(vendor, 40)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM billguard.check_billing_period(billing_period);
  IF NOT billguard.are_vault_endpoints(allowed_endpoints) THEN
    RAISE EXCEPTION 'allowed_endpoints must be 1..20 API paths such as /v1/payment_intents, got %',
                    coalesce(left(allowed_endpoints::text, 200), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF expires_at IS NULL OR expires_at <= now() THEN
    RAISE EXCEPTION 'expires_at must be in the future, got %', coalesce(expires_at::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF livemode IS NULL THEN
    RAISE EXCEPTION 'livemode must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;

  -- The issuer token's request (issuer_max_period_usd given; the admin's is
  -- NULL): the dispatcher's, never more. Its key (vault_key_request) is for
  -- vendor stripe and the charge endpoints and their search, and it creates
  -- a budget only up to the operator's ceiling. Where the period's budget
  -- exists, the cap check below applies as to the admin: another cap is 409
  -- naming the budget's, and joining at it raises nothing, so a budget an
  -- admin made larger than the ceiling is still joined. The issuer is who
  -- the cap guards against (billing software, a compromised billing
  -- database): another vendor name, other endpoints or a larger new budget
  -- are the admin's.
  IF issuer_max_period_usd IS NOT NULL THEN
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
    IF cap > billguard.usd_to_cents(issuer_max_period_usd)
       AND NOT EXISTS (SELECT FROM billguard.vault_budgets b
                        WHERE (b.vendor, b.billing_period, b.currency)
                            = (vault_issue_key.vendor, vault_issue_key.billing_period, 'usd')) THEN
      RAISE EXCEPTION 'the issuer token may create a budget of at most % USD (--issuer-max-period-usd), not % USD for billing_period %',
                      to_char(billguard.usd_to_cents(issuer_max_period_usd) / 100.0, 'FM999999999999990.00'),
                      to_char(cap / 100.0, 'FM999999999999990.00'), billing_period
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Have an admin create the period''s budget (POST /keys with the admin token), or raise the ceiling.';
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
  VALUES (vendor, billing_period, 'usd', cap)
  ON CONFLICT DO NOTHING;
  SELECT * INTO STRICT budget FROM billguard.vault_budgets b
   WHERE (b.vendor, b.billing_period, b.currency)
       = (vault_issue_key.vendor, vault_issue_key.billing_period, 'usd')
     FOR UPDATE;
  IF budget.cap_cents <> cap THEN
    RAISE EXCEPTION 'billing_period % of % already has a cap of % USD', billing_period, vendor,
                    to_char(budget.cap_cents / 100.0, 'FM999999999999990.00')
      USING ERRCODE = 'unique_violation',
            DETAIL = 'A second key of a period joins its budget and never changes its cap.',
            HINT = 'Ask with the same period_usd_cap, or have an admin raise the cap.';
  END IF;

  secret := CASE WHEN livemode THEN 'vk_live_' ELSE 'vk_test_' END || billguard.random_base62(32);
  new_key_id := 'vkey_' || billguard.random_base62(16);
  cap_cents := cap;
  INSERT INTO billguard.vault_keys (key_id, secret_sha256, vendor, billing_period, currency,
                                    allowed_endpoints, livemode, expires_at)
  VALUES (new_key_id, sha256(convert_to(secret, 'UTF8')), vendor, billing_period, 'usd',
          allowed_endpoints, livemode, expires_at);

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, currency, decision, reason)
  VALUES (new_key_id, vendor, billing_period, 'usd', 'issued',
          format('cap %s USD, endpoints %s, expires %s',
                 to_char(cap / 100.0, 'FM999999999999990.00'),
                 array_to_string(allowed_endpoints, ' '), expires_at));

  -- The scheduler entity records every key issued; the advisory lock
  -- serialises appends to it, as bill_period's do.
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  PERFORM billguard.append_event('billing-scheduler', billguard.highest_seq_nr('billing-scheduler'),
                                 'VaultKeyIssued',
                                 jsonb_build_object('billing_period', billing_period,
                                                    'key_id', new_key_id,
                                                    'cap_usd', round(cap / 100.0, 2),
                                                    'vendor', vendor));
  RETURN NEXT;
END $$;
