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
CREATE FUNCTION billguard.vault_authorize(secret_sha256 bytea, method text, endpoint text,
                                          idempotency_key text, request_digest text,
                                          amount_cents bigint, currency text, customer text,
                                          search_key text DEFAULT NULL,
                                          idempotency_window interval DEFAULT '23 hours')
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
       WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
           = (k.vendor, k.billing_period, k.currency, idem)
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
        reason := format('the spend cap of billing_period %s is held by charges in flight or of '
                         'unknown outcome; retry later with the same Idempotency-Key', k.billing_period);
      ELSE
        code := 'spend_cap_exceeded';
        reason := format('spend cap exceeded for billing_period %s', k.billing_period);
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
       WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
           = (k.vendor, k.billing_period, k.currency, idem)
      RETURNING r.attempts INTO attempt_no;
    ELSE
      INSERT INTO billguard.vault_reservations
             (vendor, billing_period, currency, idempotency_key, request_digest, key_id, endpoint,
              customer, amount_cents, search_key, attempts, attempts_in_doubt, last_forwarded_at)
      VALUES (k.vendor, k.billing_period, k.currency, idem, vault_authorize.request_digest, k.key_id,
              vault_authorize.endpoint, vault_authorize.customer, amount, vault_authorize.search_key,
              1, ARRAY[1], now());
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
                                     reason)
  VALUES (k.key_id, k.vendor, k.billing_period, vault_authorize.method, vault_authorize.endpoint,
          vault_authorize.customer, amount, lower(vault_authorize.currency), idem, verdict, status,
          reason);
  RETURN QUERY SELECT verdict, status, answer, k.key_id, replay_request_id, attempt_no, retriable;
END $$;
COMMENT ON FUNCTION billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text, text, interval) IS
  'Decides a request of the spend-cap proxy and reserves its amount; audited.';

-- The reservation of an Idempotency-Key in the budget a vault key spends,
-- with the key's lock taken (as vault_authorize takes it; the budget's row
-- lock, when its committed sum changes at all, comes last): what
-- vault_settle and vault_reconcile decide on. P0002 when there is none.
CREATE FUNCTION billguard.lock_vault_reservation(key_id text, idempotency_key text)
  RETURNS billguard.vault_reservations
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  k    billguard.vault_keys;
  held billguard.vault_reservations;
BEGIN
  SELECT * INTO k FROM billguard.vault_keys v WHERE v.key_id = lock_vault_reservation.key_id;
  PERFORM billguard.lock_vault_idempotency_key(k.vendor, k.billing_period, k.currency,
                                               lock_vault_reservation.idempotency_key);
  SELECT * INTO held FROM billguard.vault_reservations r
   WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
       = (k.vendor, k.billing_period, k.currency, lock_vault_reservation.idempotency_key);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no reservation of vault key % for Idempotency-Key %',
                    coalesce(quote_literal(left(lock_vault_reservation.key_id, 40)), 'NULL'),
                    coalesce(quote_literal(left(lock_vault_reservation.idempotency_key, 255)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;
  RETURN held;
END $$;

-- Ends a reservation's doubt: settled (a success, its answer kept to be
-- replayed) or released (no attempt of its key can have charged).
CREATE FUNCTION billguard.close_vault_reservation(held billguard.vault_reservations, outcome text,
                                                  upstream_status integer, charge_id text,
                                                  response_body text, request_id text)
  RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF outcome = 'settled' THEN
    UPDATE billguard.vault_reservations r
       SET status = 'settled', upstream_status = close_vault_reservation.upstream_status,
           charge_id = close_vault_reservation.charge_id,
           response_status = close_vault_reservation.upstream_status,
           response_body = coalesce(close_vault_reservation.response_body, ''),
           response_request_id = close_vault_reservation.request_id, settled_at = now(),
           attempts_in_doubt = '{}'
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (held.vendor, held.billing_period, held.currency, held.idempotency_key);
  ELSE
    UPDATE billguard.vault_reservations r
       SET status = 'released', attempts_in_doubt = '{}',
           upstream_status = coalesce(close_vault_reservation.upstream_status, r.upstream_status)
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (held.vendor, held.billing_period, held.currency, held.idempotency_key);
  END IF;
END $$;

-- The budget's committed sum once a reservation `held` became `outcome`,
-- as the last write before the commit, and only when the reservation
-- starts or stops being counted: a success settling a reservation was
-- counted when it was reserved, and leaves the budget's row alone. A
-- success after a release
-- (Stripe answering a key it refused before) is still money spent: it is
-- counted again, whatever the cap says.
-- PL/pgSQL, whose plans a session keeps, rather than SQL, whose body is
-- planned again at every call: this runs at every settle.
CREATE FUNCTION billguard.recount_vault_budget(held billguard.vault_reservations, outcome text)
  RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF (outcome = 'settled' AND held.status = 'released') OR (outcome = 'released' AND held.status = 'reserved') THEN
    UPDATE billguard.vault_budgets b
       SET committed_cents = b.committed_cents
                             + CASE WHEN outcome = 'settled' THEN held.amount_cents ELSE -held.amount_cents END,
           updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (held.vendor, held.billing_period, held.currency);
  END IF;
END $$;

-- Stripe's answer to attempt `attempt` of a request vault_authorize
-- reserved or reused. 2xx: settled, its answer kept for replays. 402, or
-- 400/404 of type invalid_request_error: Stripe refused this attempt; 409
-- (the key in use) and 429 (rate limited): it never executed. Either
-- releases the amount only when no other attempt of the key is in doubt;
-- otherwise the amount stays reserved until a success or vault_reconcile
-- settles it. Anything else (500, 502-504, timeouts and dropped
-- connections as upstream_status 0): the attempt's outcome is unknown, it
-- stays in doubt, and so does the reservation. Answering an attempt again
-- changes nothing, so a settle may be retried. Answers settled, released
-- or unknown.
CREATE FUNCTION billguard.vault_settle(key_id text, idempotency_key text, upstream_status integer,
                                       error_type text, charge_id text, response_body text,
                                       request_id text, attempt integer)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  held    billguard.vault_reservations;
  kind    text;      -- settled, refused, not_executed or unknown
  outcome text;
  still_in_doubt integer[];
  why     text;
BEGIN
  IF upstream_status IS NULL OR upstream_status NOT BETWEEN 0 AND 599 THEN
    RAISE EXCEPTION 'upstream_status must be 0 (no answer) or an HTTP status'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  held := billguard.lock_vault_reservation(vault_settle.key_id, vault_settle.idempotency_key);
  IF vault_settle.attempt IS NULL OR vault_settle.attempt NOT BETWEEN 1 AND held.attempts THEN
    RAISE EXCEPTION 'attempt must be one of the key''s attempts, 1..%, got %', held.attempts,
                    coalesce(vault_settle.attempt::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  kind := CASE
    WHEN upstream_status BETWEEN 200 AND 299 THEN 'settled'
    WHEN upstream_status = 402 OR (upstream_status IN (400, 404)
                                   AND vault_settle.error_type = 'invalid_request_error') THEN 'refused'
    -- Stripe's rate limiters run before its idempotency layer, and a key in
    -- use is refused before the request runs: neither executed anything.
    WHEN upstream_status IN (409, 429) THEN 'not_executed'
    ELSE 'unknown'
  END;
  still_in_doubt := CASE WHEN kind = 'unknown' THEN held.attempts_in_doubt
                         ELSE array_remove(held.attempts_in_doubt, vault_settle.attempt) END;
  outcome := CASE WHEN kind = 'settled' THEN 'settled'
                  WHEN kind = 'unknown' OR still_in_doubt <> '{}' THEN 'unknown'
                  ELSE 'released' END;
  IF (outcome = 'settled' AND held.status <> 'settled') OR (outcome = 'released' AND held.status = 'reserved') THEN
    PERFORM billguard.close_vault_reservation(held, outcome, vault_settle.upstream_status,
                                              vault_settle.charge_id, vault_settle.response_body,
                                              vault_settle.request_id);
  ELSIF held.status = 'reserved' THEN
    UPDATE billguard.vault_reservations r
       SET upstream_status = vault_settle.upstream_status, attempts_in_doubt = still_in_doubt
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (held.vendor, held.billing_period, held.currency, held.idempotency_key);
    IF kind <> 'unknown' THEN
      why := format('%s %s to attempt %s, but attempt %s of the key may have charged: kept reserved '
                    'until reconciled', upstream_status, coalesce(vault_settle.error_type, ''),
                    vault_settle.attempt, array_to_string(still_in_doubt, ', '));
    END IF;
  END IF;

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (vault_settle.key_id, held.vendor, held.billing_period, 'POST', held.endpoint, held.customer,
          held.amount_cents, held.currency, vault_settle.idempotency_key, outcome, upstream_status,
          CASE WHEN outcome = 'settled' THEN coalesce(vault_settle.charge_id, held.charge_id)
               WHEN why IS NOT NULL THEN why
               WHEN upstream_status = 0 THEN 'no answer from upstream'
               ELSE vault_settle.error_type END);
  PERFORM billguard.recount_vault_budget(held, outcome);
  RETURN outcome;
END $$;
COMMENT ON FUNCTION billguard.vault_settle(text, text, integer, text, text, text, text, integer) IS
  'Records Stripe''s answer to one attempt of a reserved request: settled, released (no attempt can have charged) or unknown (still reserved); audited.';

-- What the proxy found at Stripe about a reservation still reserved past
-- the idempotency window, or whose attempts are in doubt long after the
-- last one: found (a charged object the key created: settled with that
-- object as its answer, which is then replayed), absent (Stripe holds no
-- charge of the key: released, so a retry is counted again from scratch)
-- or uncertain (neither can be proved: nothing changes, the reason is
-- audited). attempts is the reservation's attempt count when the lookup
-- began: an absence seen before a newer attempt proves nothing about it,
-- and is answered stale. Answers settled, released, unknown or stale.
CREATE FUNCTION billguard.vault_reconcile(key_id text, idempotency_key text, attempts integer,
                                          finding text, charge_id text, response_body text,
                                          request_id text, reason text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  held    billguard.vault_reservations;
  outcome text;
BEGIN
  IF finding IS NULL OR finding NOT IN ('found', 'absent', 'uncertain') THEN
    RAISE EXCEPTION 'finding must be found, absent or uncertain, got %', coalesce(quote_literal(finding), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF finding = 'found' AND (vault_reconcile.charge_id IS NULL OR vault_reconcile.response_body IS NULL) THEN
    RAISE EXCEPTION 'a charge found needs its id and its object' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  held := billguard.lock_vault_reservation(vault_reconcile.key_id, vault_reconcile.idempotency_key);
  outcome := CASE
    -- A charge found is a fact, whatever happened since.
    WHEN finding = 'found' THEN 'settled'
    WHEN held.status <> 'reserved' OR held.attempts IS DISTINCT FROM vault_reconcile.attempts THEN 'stale'
    WHEN finding = 'absent' THEN 'released'
    ELSE 'unknown'
  END;
  IF outcome = 'stale' OR (outcome = 'settled' AND held.status = 'settled') THEN
    RETURN outcome;
  END IF;
  IF outcome <> 'unknown' THEN
    PERFORM billguard.close_vault_reservation(held, outcome, CASE WHEN outcome = 'settled' THEN 200 END,
                                              vault_reconcile.charge_id, vault_reconcile.response_body,
                                              vault_reconcile.request_id);
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (vault_reconcile.key_id, held.vendor, held.billing_period, 'POST', held.endpoint, held.customer,
          held.amount_cents, held.currency, vault_reconcile.idempotency_key, outcome, NULL,
          left('reconciled with Stripe: ' || coalesce(vault_reconcile.reason, finding), 1000));
  PERFORM billguard.recount_vault_budget(held, outcome);
  RETURN outcome;
END $$;
COMMENT ON FUNCTION billguard.vault_reconcile(text, text, integer, text, text, text, text, text) IS
  'Settles or releases a reserved request from what the proxy found at Stripe; audited.';

-- The reservations whose attempts are in doubt and whose last attempt was
-- forwarded more than quiet_for ago: no attempt of them is still on its
-- way, and the proxy looks each up at Stripe by itself, so that no
-- unknown outcome holds a budget's room, or waits for its key to come
-- back, for ever. The oldest first.
CREATE FUNCTION billguard.vault_reservations_in_doubt(quiet_for interval, max_rows integer)
  RETURNS TABLE (key_id text, idempotency_key text, endpoint text, customer text, search_key text,
                 attempts integer, reserved_at double precision, last_forwarded_at double precision)
  LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT r.key_id, r.idempotency_key, r.endpoint, r.customer, r.search_key, r.attempts,
           extract(epoch FROM r.reserved_at)::double precision,
           extract(epoch FROM coalesce(r.last_forwarded_at, r.reserved_at))::double precision
      FROM billguard.vault_reservations r
     WHERE r.status = 'reserved' AND r.attempts_in_doubt <> '{}'
       AND coalesce(r.last_forwarded_at, r.reserved_at) < now() - vault_reservations_in_doubt.quiet_for
     ORDER BY coalesce(r.last_forwarded_at, r.reserved_at)
     LIMIT greatest(vault_reservations_in_doubt.max_rows, 0);
  END;
COMMENT ON FUNCTION billguard.vault_reservations_in_doubt(interval, integer) IS
  'Reserved requests with attempts in doubt and no attempt for quiet_for, oldest first: for the proxy''s reconciler.';
