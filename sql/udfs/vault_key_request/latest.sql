-- The POST /keys body for the period's budget in `currency`: vendor
-- stripe; a cap of the period's claimed total in that currency (every
-- record of the period in it but the cancelled, at least 50 of its
-- smallest unit) times headroom, rounded up to its smallest unit in
-- numeric, never floating point, and sent as period_usd_cap for USD (as
-- every proxy since 0.1.0 takes it), else as period_cap in the currency's
-- major unit; the endpoints the period's records use (as stored by their
-- first claim, else `endpoint`) and their search; the connected accounts
-- its records are charged on (stripe_accounts, none for the platform's
-- own); and an expiry 35 days past the later of the period's end and now,
-- long enough for the period's retries and reconciliation (hours), short
-- enough that a leaked key dies by itself. A record still sending after
-- that meets an expired key, and the dispatcher obtains a new one for the
-- same budget. existing_cap_cents, when given, is asked instead: the cap
-- of the period's existing budget, which a key must name to join it (the
-- proxy's 409).
CREATE OR REPLACE FUNCTION billguard.vault_key_request(billing_period text, endpoint text, headroom numeric,
                                            existing_cap_cents bigint DEFAULT NULL,
                                            currency text DEFAULT 'usd')
  RETURNS TABLE (body jsonb, cap_cents bigint)
  LANGUAGE plpgsql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  total     numeric;
  endpoints text[];
  accounts  text[];
  asked     bigint := vault_key_request.existing_cap_cents;
  decimals  integer;
BEGIN
  PERFORM billguard.check_billing_period(vault_key_request.billing_period);
  IF headroom IS NULL OR headroom < 1 OR headroom > 10 THEN
    RAISE EXCEPTION 'headroom must be between 1 and 10, got %', coalesce(headroom::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT c.minor_units INTO decimals FROM billguard.currencies c WHERE c.code = vault_key_request.currency;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'currency must be a lower-case ISO 4217 code of billguard.currencies, got %',
                    coalesce(quote_literal(left(vault_key_request.currency, 16)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT coalesce(sum(r.amount_cents), 0),
         array_agg(DISTINCT coalesce(r.stripe_endpoint, vault_key_request.endpoint)),
         array_agg(DISTINCT r.stripe_account COLLATE "C") FILTER (WHERE r.stripe_account IS NOT NULL)
    INTO total, endpoints, accounts
    FROM billguard.billing_records r
   WHERE r.billing_period = vault_key_request.billing_period AND r.currency = vault_key_request.currency
     AND r.status <> 'cancelled';
  endpoints := coalesce(endpoints, ARRAY[vault_key_request.endpoint]);
  cap_cents := coalesce(asked, ceil(greatest(total, 50) * headroom)::bigint);
  IF cap_cents <= 0 THEN
    RAISE EXCEPTION 'cap_cents must be positive, got %', cap_cents
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  body := jsonb_build_object(
    'vendor', 'stripe',
    'billing_period', vault_key_request.billing_period,
    'currency', vault_key_request.currency,
    CASE WHEN vault_key_request.currency = 'usd' THEN 'period_usd_cap' ELSE 'period_cap' END,
    round(cap_cents / 10::numeric ^ decimals, decimals),
    'allowed_endpoints', (SELECT jsonb_agg(e ORDER BY e)
                            FROM unnest(endpoints || ARRAY(SELECT x || '/search' FROM unnest(endpoints) x)) e),
    'stripe_accounts', to_jsonb(coalesce(accounts, '{}')),
    'expires_at', to_char((greatest((vault_key_request.billing_period || '-01')::date + interval '1 month',
                                    now()) + interval '35 days') AT TIME ZONE 'UTC',
                          'YYYY-MM-DD"T"HH24:MI:SS"Z"'));
  RETURN NEXT;
END $$;
