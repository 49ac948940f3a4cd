-- The dispatch queue: what the dispatcher worker claims, and how each
-- answer from Stripe is recorded. Every function runs in the worker's own
-- short transaction; no HTTP request is ever made while one is open.

-- Appends an event to a billing entity. Callers hold the record's row lock,
-- which serialises all writers of that entity, so max + 1 cannot race.
CREATE FUNCTION billguard.append_billing_event(customer_id text, billing_period text,
                                               event_type text, event jsonb)
  RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  entity text := 'billing-' || customer_id || '-' || billing_period;
BEGIN
  INSERT INTO billguard.journal AS j (persistence_id, seq_nr, customer_id, event_type, event)
  VALUES (entity,
          coalesce((SELECT max(h.seq_nr) FROM billguard.journal h WHERE h.persistence_id = entity), 0) + 1,
          append_billing_event.customer_id, append_billing_event.event_type, append_billing_event.event);
END $$;

-- Exponential backoff with jitter, as Stripe's clients do: 0.5 s doubling,
-- capped, scaled by a random factor in [0.5, 1).
CREATE FUNCTION billguard.retry_delay(attempt integer, cap_seconds double precision DEFAULT 60)
  RETURNS interval
  LANGUAGE plpgsql VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  RETURN make_interval(secs => least(0.5 * power(2, greatest(attempt - 1, 0)), cap_seconds)
                               * (0.5 + random() / 2));
END $$;

-- At dispatcher start: rows a previous dispatcher left 'dispatching' are due
-- now, to be re-sent with their stored key.
CREATE FUNCTION billguard.requeue_abandoned() RETURNS bigint
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  AS $$
  WITH requeued AS (
    UPDATE billguard.billing_records
       SET next_attempt_at = now(), lease_expires_at = NULL, updated_at = now()
     WHERE status = 'dispatching'
    RETURNING 1)
  SELECT count(*) FROM requeued;
$$;

-- The form body of a record's charge (extension/charge_request.cpp, over the
-- encoder of common/stripe_request.*); stored by the claim that first sends it.
CREATE FUNCTION billguard.charge_request_body(endpoint text, idempotency_key text,
                                              customer_id text, billing_period text,
                                              amount_cents bigint, currency text,
                                              stripe_customer text, payment_method text)
  RETURNS text
  LANGUAGE c IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_charge_request_body';

-- Claims up to max_rows due records: status 'dispatching', attempts + 1,
-- first_dispatched_at set once, a lease (a dispatching row whose lease
-- expires is due again), and on its first claim the request it sends for
-- good: `endpoint` and the body built for it. action says what to send:
--   'charge'  POST the stored body to the stored endpoint with the key;
--   'search'  look the charge up first: the outcome of an earlier attempt
--             is unknown (a cached 500), or the first dispatch is older than
--             idempotency_window, so Stripe may have pruned the key.
CREATE FUNCTION billguard.claim_due_records(max_rows integer, lease interval,
                                            idempotency_window interval, endpoint text)
  RETURNS TABLE (idempotency_key text, attempt integer, action text, customer_id text,
                 billing_period text, stripe_endpoint text, request_body text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
BEGIN
  -- The dispatcher commits its answers asynchronously (a lost answer is
  -- re-sent with the same key and replayed by Stripe), but a claim is
  -- flushed before any request leaves.
  PERFORM set_config('synchronous_commit', 'on', true);
  RETURN QUERY
  WITH due AS (
    SELECT r.idempotency_key, r.status, r.first_dispatched_at
      FROM billguard.billing_records r
     WHERE r.status IN ('pending', 'dispatching', 'unknown') AND r.next_attempt_at <= now()
     ORDER BY r.next_attempt_at
     LIMIT max_rows
       FOR UPDATE SKIP LOCKED
  ), claimed AS (
    UPDATE billguard.billing_records r
       SET status = 'dispatching',
           attempts = r.attempts + 1,
           first_dispatched_at = coalesce(r.first_dispatched_at, now()),
           lease_expires_at = now() + lease,
           next_attempt_at = now() + lease,
           updated_at = now(),
           stripe_endpoint = coalesce(r.stripe_endpoint, endpoint),
           request_body = coalesce(r.request_body,
             billguard.charge_request_body(endpoint, r.idempotency_key, r.customer_id,
                                           r.billing_period, r.amount_cents, r.currency,
                                           r.stripe_customer, r.payment_method))
      FROM due
     WHERE r.idempotency_key = due.idempotency_key
    RETURNING r.idempotency_key, r.attempts, r.customer_id, r.billing_period,
              r.stripe_endpoint, r.request_body,
              CASE WHEN due.status = 'unknown'
                     OR due.first_dispatched_at < now() - idempotency_window
                   THEN 'search' ELSE 'charge' END AS action
  ), journaled AS (
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    SELECT p.id,
           coalesce((SELECT max(j.seq_nr) FROM billguard.journal j WHERE j.persistence_id = p.id), 0) + 1,
           c.customer_id, 'ChargeAttempted',
           jsonb_build_object('attempt', c.attempts, 'action', c.action,
                              'idempotency_key', c.idempotency_key, 'at', now())
      FROM claimed c
     CROSS JOIN LATERAL (SELECT 'billing-' || c.customer_id || '-' || c.billing_period AS id) p
  )
  SELECT c.idempotency_key, c.attempts, c.action, c.customer_id, c.billing_period,
         c.stripe_endpoint, c.request_body
    FROM claimed c;
END $$;

-- The record of one dispatch attempt, locked, or NULL when the record has
-- moved on (its lease was taken over, an operator requeued it): a late
-- answer to an old attempt must not overwrite a newer state.
CREATE FUNCTION billguard.lock_attempt(key text, attempt integer)
  RETURNS billguard.billing_records
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  SELECT * INTO rec FROM billguard.billing_records r
   WHERE r.idempotency_key = key AND r.status = 'dispatching' AND r.attempts = attempt
     FOR UPDATE;
  RETURN rec;
END $$;

-- Whether a response body is JSON, without raising (extension/journal_events.cpp).
CREATE FUNCTION billguard.is_json(body text) RETURNS boolean
  LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_is_json';

-- jsonb of a response body, or NULL when it is not JSON.
CREATE FUNCTION billguard.json_or_null(body text) RETURNS jsonb
  LANGUAGE sql IMMUTABLE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE WHEN billguard.is_json(body) THEN body::jsonb END;

-- What an answer from Stripe means, following Stripe's documented
-- semantics:
--   completed     2xx
--   paused        401/403: the API key is wrong; pause everything, fail nothing
--   needs_review  idempotency_error other than key-in-use: never re-sent
--   retry         409 key in use, 429, 502/503/504 and other 5xx, or
--                 Stripe-Should-Retry: true
--   unknown       500: Stripe cached an indeterminate result for the key
--   failed        other 4xx (402 card_error, 400/404 invalid_request_error),
--                 or Stripe-Should-Retry: false
CREATE FUNCTION billguard.classify_stripe_response(http_status integer, should_retry boolean,
                                                   error_type text, error_code text)
  RETURNS text
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE
    WHEN http_status BETWEEN 200 AND 299 THEN 'completed'
    WHEN http_status IN (401, 403) THEN 'paused'
    WHEN error_type = 'idempotency_error' AND error_code IS DISTINCT FROM 'idempotency_key_in_use'
      THEN 'needs_review'
    WHEN should_retry IS TRUE THEN 'retry'
    WHEN http_status = 500 THEN 'unknown'
    WHEN should_retry IS FALSE THEN 'failed'
    WHEN http_status IN (409, 429) OR http_status >= 500 THEN 'retry'
    ELSE 'failed'
  END;

-- Records the answer to a charge request of attempt `attempt`; returns the
-- outcome (see classify_stripe_response) or 'stale' when the record is no
-- longer this attempt's (its lease was taken over).
CREATE FUNCTION billguard.record_charge_response(key text, attempt integer, http_status integer,
                                                 body text, should_retry text, replayed boolean,
                                                 max_attempts integer, settle_delay interval)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec     billguard.billing_records;
  answer  jsonb := billguard.json_or_null(body);
  err     jsonb := answer -> 'error';
  outcome text;
  detail  jsonb;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN 'stale';
  END IF;

  outcome := billguard.classify_stripe_response(
    http_status, CASE lower(should_retry) WHEN 'true' THEN true WHEN 'false' THEN false END,
    err ->> 'type', err ->> 'code');
  IF outcome = 'completed' AND coalesce(answer ->> 'id', '') = '' THEN
    outcome := 'needs_review';   -- a 2xx without an object id: a person must look
    err := jsonb_build_object('type', 'api_error', 'message', 'success response without an id');
  ELSIF outcome = 'completed'
        AND answer ->> 'status' NOT IN ('succeeded', 'processing', 'pending') THEN
    -- Created but not charged (e.g. requires_action off-session): terminal.
    outcome := 'failed';
    err := jsonb_build_object('type', 'payment_status', 'code', answer ->> 'status',
                              'message', format('%s %s is %s: not charged', answer ->> 'object',
                                                answer ->> 'id', answer ->> 'status'));
  END IF;
  detail := jsonb_strip_nulls(jsonb_build_object(
    'http_status', http_status, 'type', err ->> 'type', 'code', err ->> 'code',
    'decline_code', err ->> 'decline_code', 'message', left(err ->> 'message', 500),
    'attempt', attempt));
  IF outcome = 'retry' AND attempt >= max_attempts AND http_status NOT IN (409, 429) THEN
    outcome := 'failed';
  END IF;

  CASE outcome
    WHEN 'completed' THEN
      UPDATE billguard.billing_records r
         SET status = 'completed', charge_id = answer ->> 'id', completed_at = now(),
             lease_expires_at = NULL, last_error = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingCompleted',
        jsonb_build_object('charge_id', answer ->> 'id', 'replayed', coalesce(replayed, false),
                           'http_status', http_status, 'attempt', attempt));
    WHEN 'paused' THEN
      -- The key was refused before anything was charged: the attempt does
      -- not count, and the record waits for a fixed key.
      UPDATE billguard.billing_records r
         SET status = 'pending', attempts = r.attempts - 1, next_attempt_at = now(),
             lease_expires_at = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
    WHEN 'retry' THEN
      UPDATE billguard.billing_records r
         SET status = 'pending', next_attempt_at = now() + billguard.retry_delay(attempt),
             lease_expires_at = NULL, last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingFailed',
        detail || jsonb_build_object('terminal', false));
    WHEN 'unknown' THEN
      -- Search is eventually consistent: do not conclude "absent" before
      -- the settle delay has passed.
      UPDATE billguard.billing_records r
         SET status = 'unknown', next_attempt_at = now() + settle_delay,
             lease_expires_at = NULL, last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ChargeUnknown',
        detail);
    WHEN 'needs_review' THEN
      UPDATE billguard.billing_records r
         SET status = 'needs_review', lease_expires_at = NULL,
             last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'NeedsReview',
        detail);
    ELSE  -- failed
      UPDATE billguard.billing_records r
         SET status = 'failed', lease_expires_at = NULL,
             last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingFailed',
        detail || jsonb_build_object('terminal', true));
  END CASE;
  RETURN outcome;
END $$;

-- One line for billing_records.last_error, e.g.
-- "402 card_error/card_declined: Your card was declined."
CREATE FUNCTION billguard.error_text(detail jsonb) RETURNS text
  LANGUAGE sql IMMUTABLE
  SET search_path = pg_catalog, pg_temp
  RETURN concat_ws(' ', detail ->> 'http_status',
                   nullif(concat_ws('/', detail ->> 'type', detail ->> 'code'), '') || ':',
                   detail ->> 'message');

-- Records a request that got no HTTP answer (connection error, timeout).
-- The charge may or may not exist: retry with the same key until a
-- definitive answer, and fail only after max_attempts.
CREATE FUNCTION billguard.record_transport_error(key text, attempt integer, message text,
                                                 max_attempts integer)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec      billguard.billing_records;
  terminal boolean := attempt >= max_attempts;
  detail   jsonb := jsonb_build_object('type', 'network', 'message', left(message, 500),
                                       'attempt', attempt);
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN 'stale';
  END IF;
  UPDATE billguard.billing_records r
     SET status = CASE WHEN terminal THEN 'failed' ELSE 'pending' END,
         next_attempt_at = now() + billguard.retry_delay(attempt),
         lease_expires_at = NULL,
         last_error = 'network: ' || left(message, 500)
                      || CASE WHEN terminal THEN ' (outcome unknown: reconcile before retrying)' ELSE '' END,
         updated_at = now()
   WHERE r.idempotency_key = key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingFailed',
    detail || jsonb_build_object('terminal', terminal));
  RETURN CASE WHEN terminal THEN 'failed' ELSE 'retry' END;
END $$;

-- Records the answer to a search for the record's charge. Returns
-- 'completed' (found: ChargeReconciled), 'charge' (not found: send the
-- charge now, same key, same lease), 'paused', 'retry' or 'stale'.
CREATE FUNCTION billguard.record_search_result(key text, attempt integer, http_status integer,
                                               body text)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec    billguard.billing_records;
  answer jsonb := billguard.json_or_null(body);
  found  jsonb;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN 'stale';
  END IF;
  IF http_status IN (401, 403) THEN
    UPDATE billguard.billing_records r
       SET status = 'unknown', attempts = r.attempts - 1, next_attempt_at = now(),
           lease_expires_at = NULL, updated_at = now()
     WHERE r.idempotency_key = key;
    RETURN 'paused';
  END IF;
  IF http_status <> 200 OR jsonb_typeof(answer -> 'data') IS DISTINCT FROM 'array' THEN
    -- We still do not know whether an earlier attempt charged: stay unknown.
    UPDATE billguard.billing_records r
       SET status = 'unknown', next_attempt_at = now() + billguard.retry_delay(attempt),
           lease_expires_at = NULL,
           last_error = 'search failed with HTTP ' || http_status, updated_at = now()
     WHERE r.idempotency_key = key;
    RETURN 'retry';
  END IF;

  SELECT o INTO found FROM jsonb_array_elements(answer -> 'data') o
   WHERE o -> 'metadata' ->> 'billguard_key' = key
     AND (o ->> 'status' IN ('succeeded', 'processing') OR (o ->> 'paid')::boolean)
   LIMIT 1;
  IF found IS NULL THEN
    RETURN 'charge';
  END IF;
  UPDATE billguard.billing_records r
     SET status = 'completed', charge_id = found ->> 'id', completed_at = now(),
         lease_expires_at = NULL, last_error = NULL, updated_at = now()
   WHERE r.idempotency_key = key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ChargeReconciled',
    jsonb_build_object('charge_id', found ->> 'id', 'via', 'search', 'attempt', attempt));
  RETURN 'completed';
END $$;

-- Returns a claimed record that was never sent to the queue (the dispatcher
-- paused before sending it): the attempt does not count, and the record is
-- due again at once. A record claimed for a search goes back to 'unknown'.
CREATE FUNCTION billguard.release_claim(key text, attempt integer, search boolean)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN 'stale';
  END IF;
  UPDATE billguard.billing_records r
     SET status = CASE WHEN search THEN 'unknown' ELSE 'pending' END,
         attempts = r.attempts - 1, next_attempt_at = now(), lease_expires_at = NULL,
         updated_at = now()
   WHERE r.idempotency_key = key;
  RETURN 'released';
END $$;
