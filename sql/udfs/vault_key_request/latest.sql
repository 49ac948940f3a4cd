-- The POST /keys body for the period's USD budget (the proxy's budgets are
-- in USD): vendor stripe; a cap of the period's claimed total (every record
-- of the period in USD but the cancelled, at least Stripe's 50-cent
-- minimum) times headroom, rounded up to whole cents in numeric, never
-- floating point; the endpoints the period's records use (as stored by
-- their first claim, else `endpoint`) and their search; and an expiry 35
-- days past the later of the period's end and now, long enough for the
-- period's retries and reconciliation (hours), short enough that a leaked
-- key dies by itself. A record still sending after that meets an expired
-- key, and the dispatcher obtains a new one for the same budget.
-- existing_cap_cents, when given, is asked instead: the cap of the period's existing
-- budget, which a key must name to join it (the proxy's 409).
CREATE OR REPLACE FUNCTION billguard.vault_key_request(billing_period text, endpoint text, headroom numeric,
                                            existing_cap_cents bigint DEFAULT NULL)
  RETURNS TABLE (body jsonb, cap_cents bigint)
  LANGUAGE plpgsql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  total     numeric;
  endpoints text[];
  asked     bigint := vault_key_request.existing_cap_cents;
BEGIN
  PERFORM billguard.check_billing_period(vault_key_request.billing_period);
  IF headroom IS NULL OR headroom < 1 OR headroom > 10 THEN
    RAISE EXCEPTION 'headroom must be between 1 and 10, got %', coalesce(headroom::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT coalesce(sum(r.amount_cents), 0),
         array_agg(DISTINCT coalesce(r.stripe_endpoint, vault_key_request.endpoint))
    INTO total, endpoints
    FROM billguard.billing_records r
   WHERE r.billing_period = vault_key_request.billing_period AND r.currency = 'usd'
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
    'period_usd_cap', round(cap_cents / 100.0, 2),
    'allowed_endpoints', (SELECT jsonb_agg(e ORDER BY e)
                            FROM unnest(endpoints || ARRAY(SELECT x || '/search' FROM unnest(endpoints) x)) e),
    'expires_at', to_char((greatest((vault_key_request.billing_period || '-01')::date + interval '1 month',
                                    now()) + interval '35 days') AT TIME ZONE 'UTC',
                          'YYYY-MM-DD"T"HH24:MI:SS"Z"'));
  RETURN NEXT;
END $$;
