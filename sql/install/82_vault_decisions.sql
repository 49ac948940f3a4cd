-- The proxy's two decisions per forwarded request: vault_authorize before
-- it forwards (may this key make this call, and does the budget have room),
-- vault_settle after Stripe answered. Decisions on one Idempotency-Key are
-- serialised by an advisory lock of that key, so a retry is counted once.
-- The budget's committed sum (80_vault_ledger.sql) changes only when a
-- reservation starts or stops being counted: a reservation, a release, a
-- success after a release. That change takes the budget's row lock, as the
-- last write before the commit, so that concurrent decisions wait on it as
-- briefly as possible and no concurrency overspends a cap; a success
-- settling a reservation leaves the budget's row alone. Each decision
-- writes one vault_audit row.

-- Serialises the decisions on one Idempotency-Key of a budget until the
-- transaction ends: vault_authorize and vault_settle take the same lock.
CREATE FUNCTION billguard.lock_vault_idempotency_key(vendor text, billing_period text,
                                                     currency text, idempotency_key text)
  RETURNS void
  LANGUAGE sql VOLATILE
  SET search_path = pg_catalog, pg_temp
  -- A class of its own for the first key: 'bg' 0x0003.
  AS $$ SELECT pg_advisory_xact_lock(1651068163, hashtext(concat_ws('/', vendor, billing_period,
                                                                    currency, idempotency_key))) $$;

-- Refusal bodies as Stripe shapes its errors, so every Stripe client
-- surfaces them as Stripe errors.
CREATE FUNCTION billguard.stripe_error_body(error_type text, code text, message text) RETURNS text
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN jsonb_build_object('error', jsonb_strip_nulls(jsonb_build_object(
           'type', error_type, 'code', code, 'message', message)))::text;

-- secret_sha256: SHA-256 of the vault key the caller presented (the proxy
-- never passes the secret). request_digest: SHA-256 (hex) of the method,
-- path and parameters. amount_cents NULL: a request that moves no money
-- (reads, search), allowed by scope alone and never counted.
-- Answers decision: forwarded (not counted), reserved (counted now), reused
-- (the key's reservation, counted once already), replayed (a settled
-- success: answer with http_status and body, and forward nothing) or refused
-- (answer with http_status and body). key_id names the key for vault_settle.
CREATE FUNCTION billguard.vault_authorize(secret_sha256 bytea, method text, endpoint text,
                                          idempotency_key text, request_digest text,
                                          amount_cents bigint, currency text, customer text)
  RETURNS TABLE (decision text, http_status integer, body text, key_id text, request_id text)
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
                          AND r.status = 'settled' AND r.charge_id = object_id) THEN
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
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, idem);
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
      status := 429; code := 'spend_cap_exceeded';
      reason := format('spend cap exceeded for billing_period %s', k.billing_period);
      EXIT decide;
    END IF;
    -- Written under the budget's lock, so that concurrent reservations never
    -- share the key lock their foreign keys take on the budget and key rows.
    IF known_key THEN   -- released earlier: counted again while it is retried
      UPDATE billguard.vault_reservations r SET status = 'reserved', key_id = k.key_id
       WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
           = (k.vendor, k.billing_period, k.currency, idem);
    ELSE
      INSERT INTO billguard.vault_reservations
             (vendor, billing_period, currency, idempotency_key, request_digest, key_id, endpoint,
              customer, amount_cents)
      VALUES (k.vendor, k.billing_period, k.currency, idem, vault_authorize.request_digest, k.key_id,
              vault_authorize.endpoint, vault_authorize.customer, amount);
    END IF;
    verdict := 'reserved';
  END;

  IF verdict IS NULL THEN
    verdict := 'refused';
    answer := billguard.stripe_error_body(error_type, code, reason);
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (k.key_id, k.vendor, k.billing_period, vault_authorize.method, vault_authorize.endpoint,
          vault_authorize.customer, amount, lower(vault_authorize.currency), idem, verdict, status,
          reason);
  RETURN QUERY SELECT verdict, status, answer, k.key_id, replay_request_id;
END $$;
COMMENT ON FUNCTION billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text) IS
  'Decides a request of the spend-cap proxy and reserves its amount; audited.';

-- Stripe's answer to a request vault_authorize reserved or reused.
-- 2xx: settled, its answer kept for replays. 402, or 400/404 of type
-- invalid_request_error: Stripe refused it, released. Anything else (500,
-- 409, 429, timeouts and dropped connections as upstream_status 0): the
-- outcome is unknown, and the amount stays reserved until a later request
-- with the same Idempotency-Key settles it. Answers settled, released or unknown.
CREATE FUNCTION billguard.vault_settle(key_id text, idempotency_key text, upstream_status integer,
                                       error_type text, charge_id text, response_body text,
                                       request_id text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  k       billguard.vault_keys;
  held    billguard.vault_reservations;
  outcome text;
BEGIN
  IF upstream_status IS NULL OR upstream_status NOT BETWEEN 0 AND 599 THEN
    RAISE EXCEPTION 'upstream_status must be 0 (no answer) or an HTTP status'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT * INTO k FROM billguard.vault_keys v WHERE v.key_id = vault_settle.key_id;
  -- The Idempotency-Key's lock (as vault_authorize takes it); the budget's
  -- row lock, when its committed sum changes at all, comes last.
  PERFORM billguard.lock_vault_idempotency_key(k.vendor, k.billing_period, k.currency,
                                               vault_settle.idempotency_key);
  SELECT * INTO held FROM billguard.vault_reservations r
   WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
       = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no reservation of vault key % for Idempotency-Key %',
                    coalesce(quote_literal(left(vault_settle.key_id, 40)), 'NULL'),
                    coalesce(quote_literal(left(vault_settle.idempotency_key, 255)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;

  outcome := CASE
    WHEN upstream_status BETWEEN 200 AND 299 THEN 'settled'
    WHEN upstream_status = 402 OR (upstream_status IN (400, 404)
                                   AND vault_settle.error_type = 'invalid_request_error') THEN 'released'
    ELSE 'unknown'
  END;
  IF outcome = 'settled' AND held.status <> 'settled' THEN
    UPDATE billguard.vault_reservations r
       SET status = 'settled', upstream_status = vault_settle.upstream_status,
           charge_id = vault_settle.charge_id, response_status = vault_settle.upstream_status,
           response_body = coalesce(vault_settle.response_body, ''),
           response_request_id = vault_settle.request_id, settled_at = now()
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  ELSIF outcome = 'released' AND held.status = 'reserved' THEN
    UPDATE billguard.vault_reservations r
       SET status = 'released', upstream_status = vault_settle.upstream_status
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  ELSIF held.status <> 'settled' THEN
    UPDATE billguard.vault_reservations r SET upstream_status = vault_settle.upstream_status
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  END IF;

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (vault_settle.key_id, k.vendor, k.billing_period, 'POST', held.endpoint, held.customer,
          held.amount_cents, k.currency, vault_settle.idempotency_key, outcome, upstream_status,
          CASE WHEN outcome = 'settled' THEN coalesce(vault_settle.charge_id, held.charge_id)
               WHEN upstream_status = 0 THEN 'no answer from upstream'
               ELSE vault_settle.error_type END);

  -- The budget last, held to the commit only, and only when its committed
  -- sum changes: a success settling a reservation was counted when it was
  -- reserved, and leaves the budget alone.
  IF outcome = 'settled' AND held.status = 'released' THEN
    -- A success after a release (Stripe answering a key it refused before)
    -- is still money spent: it is counted again, whatever the cap says.
    UPDATE billguard.vault_budgets b
       SET committed_cents = b.committed_cents + held.amount_cents, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
  ELSIF outcome = 'released' AND held.status = 'reserved' THEN
    UPDATE billguard.vault_budgets b
       SET committed_cents = b.committed_cents - held.amount_cents, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
  END IF;
  RETURN outcome;
END $$;
COMMENT ON FUNCTION billguard.vault_settle(text, text, integer, text, text, text, text) IS
  'Records Stripe''s answer to a reserved request: settled, released or unknown (still reserved); audited.';
