-- Billing through billguard-proxy: with billguard.vault_issuer_token_file
-- set, the dispatcher obtains one vault key per billing period and currency
-- from the proxy (POST /keys) before the period's first request, keeps it
-- here, and sends every charge and search of the period with it
-- (extension/vault_keys.cpp).
--
-- The secrets are readable by superusers only: nothing on this table is
-- granted to anyone, and the dispatcher runs as the bootstrap superuser.
-- The table is deliberately not registered with pg_extension_config_dump,
-- so no dump ever holds a vault key: a database restored from a dump has
-- none, and its dispatcher obtains the period's key again, which the
-- proxy's ledger joins to the period's existing budget (same cap, same
-- spend, same answers replayed).
CREATE TABLE billguard.vault_credentials (
  -- The proxy that issued the key: a key is only good there, so a new
  -- billguard.api_base obtains new keys.
  api_base       text NOT NULL,
  billing_period text NOT NULL,
  currency       text NOT NULL,
  key_id         text NOT NULL,
  vault_key      text NOT NULL,
  cap_cents      bigint NOT NULL,
  obtained_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (api_base, billing_period, currency),
  CONSTRAINT vault_credentials_period_valid CHECK (billguard.is_billing_period(billing_period)),
  CONSTRAINT vault_credentials_key_id_valid CHECK (key_id ~ '^vkey_[A-Za-z0-9]{16}$'),
  CONSTRAINT vault_credentials_key_valid CHECK (vault_key ~ '^vk_(live|test)_[A-Za-z0-9]{32}$'),
  CONSTRAINT vault_credentials_cap_valid CHECK (cap_cents > 0)
);
COMMENT ON TABLE billguard.vault_credentials IS
  'The dispatcher''s vault key per billing period and currency (superusers only; never dumped).';

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
CREATE FUNCTION billguard.vault_key_request(billing_period text, endpoint text, headroom numeric,
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

-- Keeps the key the proxy answered; a newer key of the period replaces the
-- one it had (an expired one, say).
CREATE FUNCTION billguard.store_vault_credential(api_base text, billing_period text, currency text,
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

-- Forgets a key the proxy no longer accepts (expired), unless a newer one
-- replaced it already.
CREATE FUNCTION billguard.forget_vault_credential(api_base text, billing_period text,
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
