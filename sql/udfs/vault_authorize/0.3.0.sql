-- secret_sha256: SHA-256 of the vault key the caller presented (the proxy
-- never passes the secret). request_digest: SHA-256 (hex) of the method,
-- path, parameters and the headers that change Stripe's answer
-- (Stripe-Version). amount_cents NULL: a request that moves no money
-- (reads, search), allowed by scope alone and never counted. search_key:
-- the request's metadata[billguard_key], kept to search Stripe by.
-- idempotency_window: how long the proxy trusts Stripe to remember a key.
-- Answers decision: forwarded (not counted), reserved (counted now), reused
-- (the key's reservation, counted once already), replayed (a settled
-- success: answer with http_status and body, and forward nothing),
-- reconcile (the key is still reserved past the idempotency window: find
-- out at Stripe what its attempts did, vault_reconcile, before anything is
-- forwarded; body holds what the ledger knows of it) or refused (answer
-- with http_status and body; should_retry when the refusal is a throttle).
-- key_id names the key and attempt the attempt for vault_settle.
-- stripe_account: the connected account of the request's Stripe-Account
-- header, NULL for the platform's own account (which every budget may
-- spend on); another account than its budget's is refused.
CREATE OR REPLACE FUNCTION billguard.vault_authorize(secret_sha256 bytea, method text, endpoint text,
                                          idempotency_key text, request_digest text,
                                          amount_cents bigint, currency text, customer text,
                                          search_key text DEFAULT NULL,
                                          idempotency_window interval DEFAULT '23 hours',
                                          stripe_account text DEFAULT NULL)
  RETURNS TABLE (decision text, http_status integer, body text, key_id text, request_id text,
                 attempt integer, should_retry boolean)
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  amount    bigint := vault_authorize.amount_cents;
  idem      text := vault_authorize.idempotency_key;
  k         billguard.vault_keys;
  held      billguard.vault_reservations;
  known_key boolean;   -- a reservation exists for the Idempotency-Key
  verdict   text;
  status    integer;
  error_type text := 'invalid_request_error';
  code      text;
  reason    text;
  answer    text;
  replay_request_id text;
  object_id text;      -- of a POST on an object: /v1/payment_intents/<id>/...
  attempt_no integer;
  retriable boolean := false;
  settled_cents bigint;
  -- The account the reservation is kept under ('' for the platform): Stripe
  -- scopes an Idempotency-Key to the account it acts on.
  account   text := coalesce(vault_authorize.stripe_account, '');
  allowed_accounts text[];
BEGIN
  IF octet_length(vault_authorize.secret_sha256) IS DISTINCT FROM 32 THEN
    RAISE EXCEPTION 'secret_sha256 must be 32 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.method IS NULL OR vault_authorize.method !~ '^[A-Z]{1,16}$' THEN
    RAISE EXCEPTION 'method must be an HTTP method in upper case' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.endpoint IS NULL OR vault_authorize.endpoint !~ '^/v1(/[A-Za-z0-9_]+)+$' THEN
    RAISE EXCEPTION 'endpoint must be an API path such as /v1/payment_intents, got %',
                    coalesce(quote_literal(left(vault_authorize.endpoint, 80)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.request_digest IS NULL OR vault_authorize.request_digest !~ '^[0-9a-f]{64}$' THEN
    RAISE EXCEPTION 'request_digest must be 64 lower-case hex characters' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(idem) NOT BETWEEN 1 AND 255 THEN
    RAISE EXCEPTION 'idempotency_key must be 1..255 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF amount NOT BETWEEN 1 AND 99999999 THEN
    RAISE EXCEPTION 'amount must be a positive integer of at most 99999999, got %', amount
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(vault_authorize.customer) > 255 OR octet_length(vault_authorize.currency) > 16 THEN
    RAISE EXCEPTION 'customer or currency too long' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(vault_authorize.search_key) NOT BETWEEN 1 AND 500 THEN
    RAISE EXCEPTION 'search_key must be 1..500 bytes (a metadata value)' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.stripe_account !~ '^acct_[A-Za-z0-9]{1,250}$' THEN
    RAISE EXCEPTION 'stripe_account must be a connected account id such as acct_1Nv0FGQ9RKHgCVdK, got %',
                    quote_literal(left(vault_authorize.stripe_account, 80))
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Stripe keeps a key at least 24 hours: a longer window would trust a
  -- memory Stripe may have pruned.
  IF vault_authorize.idempotency_window IS NULL
     OR vault_authorize.idempotency_window NOT BETWEEN interval '1 second' AND interval '24 hours' THEN
    RAISE EXCEPTION 'idempotency_window must be between 1 second and 24 hours, got %',
                    coalesce(vault_authorize.idempotency_window::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  <<decide>>
  BEGIN
    SELECT * INTO k FROM billguard.vault_keys v WHERE v.secret_sha256 = vault_authorize.secret_sha256;
    IF NOT FOUND THEN
      status := 401; code := 'vault_key_unknown'; reason := 'unknown vault key';
      EXIT decide;
    ELSIF k.revoked_at IS NOT NULL THEN
      status := 401; code := 'vault_key_revoked'; reason := format('vault key %s was revoked', k.key_id);
      EXIT decide;
    ELSIF k.expires_at <= now() THEN
      status := 401; code := 'vault_key_expired'; reason := format('vault key %s expired', k.key_id);
      EXIT decide;
    END IF;
    IF vault_authorize.method NOT IN ('GET', 'POST')
       OR NOT EXISTS (SELECT FROM unnest(k.allowed_endpoints) e
                       WHERE vault_authorize.endpoint = e OR starts_with(vault_authorize.endpoint, e || '/')) THEN
      status := 403; code := 'endpoint_not_allowed';
      reason := format('vault key %s may call GET and POST on %s only, not %s %s', k.key_id,
                       array_to_string(k.allowed_endpoints, ', '), vault_authorize.method,
                       vault_authorize.endpoint);
      EXIT decide;
    END IF;
    -- Only the accounts the budget names, and the platform's own: an
    -- account no key asked for is one no one meant the cap to reach.
    IF vault_authorize.stripe_account IS NOT NULL THEN
      SELECT b.stripe_accounts INTO allowed_accounts FROM billguard.vault_budgets b
       WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
      IF NOT vault_authorize.stripe_account = ANY (allowed_accounts) THEN
        status := 403; code := 'stripe_account_not_allowed';
        reason := format('vault key %s may act on the platform''s account%s only, not on %s (Stripe-Account)',
                         k.key_id,
                         CASE WHEN cardinality(allowed_accounts) > 0
                              THEN ' and ' || array_to_string(allowed_accounts, ', ') ELSE '' END,
                         vault_authorize.stripe_account);
        EXIT decide;
      END IF;
    END IF;
    -- A POST on an object (confirm, capture, update) may move money its
    -- creation counted: only one this budget created, never an object made
    -- with the real key or another budget's key, which was never counted here.
    SELECT split_part(substr(vault_authorize.endpoint, length(e) + 2), '/', 1) INTO object_id
      FROM unnest(k.allowed_endpoints) e
     WHERE vault_authorize.method = 'POST' AND starts_with(vault_authorize.endpoint, e || '/')
     ORDER BY length(e) DESC LIMIT 1;
    IF object_id IS NOT NULL
       AND NOT EXISTS (SELECT FROM billguard.vault_reservations r
                        WHERE (r.vendor, r.billing_period, r.currency) = (k.vendor, k.billing_period, k.currency)
                          AND r.stripe_account = account AND r.status = 'settled' AND r.charge_id = object_id) THEN
      status := 403; code := 'object_not_in_budget';
      reason := format('vault key %s may POST only on objects the budget of billing_period %s created, not %s',
                       k.key_id, k.billing_period, object_id);
      EXIT decide;
    END IF;
    IF amount IS NULL THEN
      verdict := 'forwarded';
      EXIT decide;
    END IF;
    IF vault_authorize.currency IS NULL THEN
      status := 400; code := 'parameter_missing'; reason := 'Missing required param: currency.';
      EXIT decide;
    ELSIF lower(vault_authorize.currency) <> k.currency THEN
      status := 403; code := 'currency_not_allowed';
      reason := format('the budget of vault key %s is in %s, not %s', k.key_id, k.currency,
                       lower(vault_authorize.currency));
      EXIT decide;
    END IF;
    IF idem IS NULL THEN
      -- Without a key a retry is a second charge, which the cap exists to stop.
      status := 400; code := 'idempotency_key_required';
      reason := 'a request with an amount needs an Idempotency-Key';
      EXIT decide;
    END IF;

    -- Decisions on one Idempotency-Key are serialised by its own lock,
    -- taken before the reservation exists; the budget's row is locked last.
    PERFORM billguard.lock_vault_idempotency_key(k.vendor, k.billing_period, k.currency, idem);
    SELECT * INTO held FROM billguard.vault_reservations r
     WHERE (r.vendor, r.billing_period, r.currency, r.stripe_account, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, account, idem);
    known_key := FOUND;
    IF known_key AND held.request_digest <> vault_authorize.request_digest THEN
      status := 400; error_type := 'idempotency_error'; code := NULL;
      reason := format('Keys for idempotent requests can only be used with the same parameters they '
                       'were first used with. Try using a key other than ''%s'' if you meant to '
                       'execute a different request.', idem);
      EXIT decide;
    ELSIF known_key AND held.status = 'settled' THEN
      verdict := 'replayed'; status := held.response_status; answer := held.response_body;
      replay_request_id := held.response_request_id;
      reason := format('settled as %s at %s', held.charge_id, held.settled_at);
      EXIT decide;
    ELSIF known_key AND held.status = 'reserved' THEN
      -- Past the window Stripe may have forgotten the key: sent again, a
      -- charge that did happen would happen twice, counted once.
      IF held.reserved_at < now() - vault_authorize.idempotency_window THEN
        verdict := 'reconcile';
        answer := jsonb_build_object(
          'key_id', held.key_id, 'endpoint', held.endpoint, 'customer', held.customer,
          'search_key', held.search_key, 'attempts', held.attempts,
          'attempts_in_doubt', to_jsonb(held.attempts_in_doubt),
          'reserved_at', extract(epoch FROM held.reserved_at),
          'last_forwarded_at', extract(epoch FROM coalesce(held.last_forwarded_at, held.reserved_at)))::text;
        reason := format('reserved at %s, past the idempotency window of %s: reconciled with Stripe '
                         'before anything is forwarded', held.reserved_at, vault_authorize.idempotency_window);
        EXIT decide;
      END IF;
      UPDATE billguard.vault_reservations r
         SET attempts = r.attempts + 1, attempts_in_doubt = r.attempts_in_doubt || (r.attempts + 1),
             last_forwarded_at = now()
       WHERE (r.vendor, r.billing_period, r.currency, r.stripe_account, r.idempotency_key)
           = (k.vendor, k.billing_period, k.currency, account, idem)
      RETURNING r.attempts INTO attempt_no;
      verdict := 'reused';
      EXIT decide;
    END IF;
    -- The cap check and the reservation in one UPDATE: the budget's row lock
    -- is held from here to the commit. Once a concurrent holder commits, the
    -- UPDATE checks the cap again against the row it left.
    UPDATE billguard.vault_budgets b SET committed_cents = b.committed_cents + amount, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency)
       AND b.committed_cents + amount <= b.cap_cents;
    IF NOT FOUND THEN
      -- Room held by reservations still open (in flight, declined but not
      -- yet settled, of unknown outcome) may come back in a moment: that
      -- refusal is a throttle. Only when what has settled leaves no room
      -- is it final. One statement, one snapshot: the budget's committed
      -- sum and its open reservations agree.
      SELECT b.committed_cents - (SELECT coalesce(sum(v.amount_cents), 0)
                                    FROM billguard.vault_reservations v
                                   WHERE (v.vendor, v.billing_period, v.currency)
                                       = (b.vendor, b.billing_period, b.currency)
                                     AND v.status = 'reserved')
        INTO settled_cents
        FROM billguard.vault_budgets b
       WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
      status := 429;
      IF settled_cents + amount <= (SELECT b.cap_cents FROM billguard.vault_budgets b
                                     WHERE (b.vendor, b.billing_period, b.currency)
                                         = (k.vendor, k.billing_period, k.currency)) THEN
        code := 'spend_cap_pending'; retriable := true;
        reason := format('the spend cap of billing_period %s%s is held by charges in flight or of '
                         'unknown outcome; retry later with the same Idempotency-Key', k.billing_period,
                         CASE WHEN k.currency <> 'usd' THEN ' in ' || upper(k.currency) ELSE '' END);
      ELSE
        code := 'spend_cap_exceeded';
        -- The contract's message, naming the budget's currency unless USD.
        reason := format('spend cap exceeded for billing_period %s', k.billing_period)
                  || CASE WHEN k.currency <> 'usd' THEN ' in ' || upper(k.currency) ELSE '' END;
      END IF;
      EXIT decide;
    END IF;
    -- Written under the budget's lock, so that concurrent reservations never
    -- share the key lock their foreign keys take on the budget and key rows.
    IF known_key THEN
      -- Released earlier, so no attempt before can have charged: counted
      -- again from this attempt on, and its window starts now.
      UPDATE billguard.vault_reservations r
         SET status = 'reserved', key_id = k.key_id, reserved_at = now(), last_forwarded_at = now(),
             attempts = r.attempts + 1, attempts_in_doubt = ARRAY[r.attempts + 1]
       WHERE (r.vendor, r.billing_period, r.currency, r.stripe_account, r.idempotency_key)
           = (k.vendor, k.billing_period, k.currency, account, idem)
      RETURNING r.attempts INTO attempt_no;
    ELSE
      INSERT INTO billguard.vault_reservations
             (vendor, billing_period, currency, idempotency_key, request_digest, key_id, endpoint,
              customer, amount_cents, search_key, attempts, attempts_in_doubt, last_forwarded_at,
              stripe_account)
      VALUES (k.vendor, k.billing_period, k.currency, idem, vault_authorize.request_digest, k.key_id,
              vault_authorize.endpoint, vault_authorize.customer, amount, vault_authorize.search_key,
              1, ARRAY[1], now(), account);
      attempt_no := 1;
    END IF;
    verdict := 'reserved';
  END;

  IF verdict IS NULL THEN
    verdict := 'refused';
    answer := billguard.stripe_error_body(error_type, code, reason);
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason, stripe_account)
  VALUES (k.key_id, k.vendor, k.billing_period, vault_authorize.method, vault_authorize.endpoint,
          vault_authorize.customer, amount, lower(vault_authorize.currency), idem,
          verdict, status, reason, vault_authorize.stripe_account);
  RETURN QUERY SELECT verdict, status, answer, k.key_id, replay_request_id, attempt_no, retriable;
END $$;
COMMENT ON FUNCTION billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text, text, interval, text) IS
  'Decides a request of the spend-cap proxy and reserves its amount; audited.';
