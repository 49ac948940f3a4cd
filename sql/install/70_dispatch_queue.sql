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

-- Exponential backoff with jitter: 0.5 s doubling, as Stripe's clients
-- start, up to cap_seconds (15 minutes), scaled by a random factor in
-- [0.5, 1). With the default 20 attempts an indeterminate outcome is retried
-- for one to two and a half hours before it needs review, so a Stripe
-- outage of minutes costs nothing but time.
CREATE FUNCTION billguard.retry_delay(attempt integer, cap_seconds double precision DEFAULT 900)
  RETURNS interval
  LANGUAGE plpgsql VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  RETURN make_interval(secs => least(0.5 * power(2, least(greatest(attempt - 1, 0), 30)), cap_seconds)
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
--             is unknown (a cached 500), or the record was claimed (created)
--             longer than idempotency_window ago, so Stripe may have pruned
--             the key of a request the record no longer knows it sent (a
--             backup restored from between that request and its recording
--             has no first_dispatched_at).
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
    SELECT r.idempotency_key, r.status, r.created_at, r.first_dispatched_at
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
                     OR least(due.created_at, due.first_dispatched_at) < now() - idempotency_window
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
-- moved on (its lease was taken over, an operator requeued it: a late
-- answer to an old attempt must not overwrite a newer state) or when another
-- session holds its row lock: the dispatcher never waits for a row, so one
-- held lock cannot halt all billing (see missed_attempt). The row is found
-- by its primary key alone, the one plan whatever the statistics say.
CREATE FUNCTION billguard.lock_attempt(key text, attempt integer)
  RETURNS billguard.billing_records
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  SELECT * INTO rec FROM billguard.billing_records r WHERE r.idempotency_key = key
     FOR UPDATE SKIP LOCKED;
  IF rec.status IS DISTINCT FROM 'dispatching' OR rec.attempts IS DISTINCT FROM attempt THEN
    RETURN NULL;
  END IF;
  RETURN rec;
END $$;

-- Why lock_attempt found nothing: 'locked' when the attempt is still the
-- record's and another session holds its row (the dispatcher records the
-- answer on a later pass; if the lease runs out first, the record is re-sent
-- with its key and Stripe replays it), else 'stale'.
CREATE FUNCTION billguard.missed_attempt(key text, attempt integer)
  RETURNS text
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  RETURN CASE WHEN (SELECT r.status = 'dispatching' AND r.attempts = attempt
                      FROM billguard.billing_records r WHERE r.idempotency_key = key)
              THEN 'locked' ELSE 'stale' END;

-- One line for billing_records.last_error, e.g.
-- "402 card_error/card_declined: Your card was declined."
CREATE FUNCTION billguard.error_text(detail jsonb) RETURNS text
  LANGUAGE sql IMMUTABLE
  SET search_path = pg_catalog, pg_temp
  RETURN concat_ws(' ', detail ->> 'http_status',
                   nullif(concat_ws('/', detail ->> 'type', detail ->> 'code'), '') || ':',
                   detail ->> 'message');

-- Records the answer to attempt `attempt` of a charge. The dispatcher has
-- read the answer and judged it (common/stripe_response.cpp); `outcome` is
-- what it means:
--   completed     charged: charge_id                      BillingCompleted
--   failed        not charged (a decline, a 4xx)           BillingFailed, terminal
--   retry         again after retry_delay(attempt)         BillingFailed, not terminal
--   throttled     a 429 or 409: the same, backoff capped at a minute
--   unknown       a cached 500: search after settle_delay  ChargeUnknown
--   needs_review  a person must look; never re-sent        NeedsReview
--   paused        the API key was refused: not counted     -
--   not_sent      never left: not counted, due again (the
--                 dispatcher holds off while Stripe is
--                 unreachable)                             ChargeNotSent
-- Every event carries Stripe's Request-Id of the answer, what Stripe support
-- asks for. Returns 'recorded', or 'stale' when the record is no longer
-- this attempt's (its lease was taken over, an operator requeued it), or
-- 'locked' when another session holds its row (see missed_attempt).
CREATE FUNCTION billguard.record_charge_response(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    replayed boolean, request_id text, error_type text, error_code text, decline_code text,
    message text, body_excerpt text, settle_delay interval)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec    billguard.billing_records;
  detail jsonb;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN billguard.missed_attempt(key, attempt);
  END IF;
  detail := jsonb_strip_nulls(jsonb_build_object(
    'http_status', nullif(http_status, 0), 'type', error_type, 'code', error_code,
    'decline_code', decline_code, 'message', message, 'body', body_excerpt,
    'request_id', request_id, 'attempt', attempt));

  CASE outcome
    WHEN 'completed' THEN
      UPDATE billguard.billing_records r
         SET status = 'completed', charge_id = record_charge_response.charge_id,
             completed_at = now(), lease_expires_at = NULL, last_error = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingCompleted',
        jsonb_strip_nulls(jsonb_build_object(
          'charge_id', record_charge_response.charge_id, 'replayed', coalesce(replayed, false),
          'http_status', http_status, 'attempt', attempt, 'request_id', request_id)));
    WHEN 'paused' THEN
      -- The key was refused before anything was charged: the attempt does
      -- not count, and the record waits for a fixed key.
      UPDATE billguard.billing_records r
         SET status = 'pending', attempts = r.attempts - 1, next_attempt_at = now(),
             lease_expires_at = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
    WHEN 'not_sent' THEN
      UPDATE billguard.billing_records r
         SET status = 'pending', attempts = r.attempts - 1, next_attempt_at = now(),
             lease_expires_at = NULL, last_error = 'not sent: ' || message, updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ChargeNotSent',
        jsonb_build_object('attempt', attempt, 'message', message));
    WHEN 'retry', 'throttled' THEN
      -- A rate limit or a key still in use backs off a minute at most.
      UPDATE billguard.billing_records r
         SET status = 'pending',
             next_attempt_at = now() + billguard.retry_delay(attempt,
                                 CASE WHEN outcome = 'throttled' THEN 60 ELSE 900 END),
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
    WHEN 'failed' THEN
      UPDATE billguard.billing_records r
         SET status = 'failed', lease_expires_at = NULL,
             last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingFailed',
        detail || jsonb_build_object('terminal', true));
  END CASE;
  RETURN 'recorded';
END $$;

-- Records the answer to attempt `attempt`'s search for the record's charge
-- (judged by the dispatcher, like charge answers):
--   completed  found charged: charge_id                     ChargeReconciled
--   absent     not found: nothing changes, the dispatcher sends the charge
--              now with the same key and lease
--   retry      the search told nothing: unknown, again after retry_delay
--   paused     the API key was refused: unknown, not counted
--   not_sent   never left: the same
-- Returns 'recorded', 'stale' or 'locked'.
CREATE FUNCTION billguard.record_search_result(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    request_id text, message text)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN billguard.missed_attempt(key, attempt);
  END IF;
  CASE outcome
    WHEN 'absent' THEN
      NULL;
    WHEN 'completed' THEN
      UPDATE billguard.billing_records r
         SET status = 'completed', charge_id = record_search_result.charge_id,
             completed_at = now(), lease_expires_at = NULL, last_error = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ChargeReconciled',
        jsonb_strip_nulls(jsonb_build_object(
          'charge_id', record_search_result.charge_id, 'via', 'search', 'attempt', attempt,
          'request_id', request_id)));
    WHEN 'retry' THEN
      -- We still do not know whether an earlier attempt charged: stay unknown.
      UPDATE billguard.billing_records r
         SET status = 'unknown', next_attempt_at = now() + billguard.retry_delay(attempt),
             lease_expires_at = NULL, last_error = message, updated_at = now()
       WHERE r.idempotency_key = key;
    WHEN 'paused', 'not_sent' THEN
      UPDATE billguard.billing_records r
         SET status = 'unknown', attempts = r.attempts - 1, next_attempt_at = now(),
             lease_expires_at = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
  END CASE;
  RETURN 'recorded';
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
    RETURN billguard.missed_attempt(key, attempt);
  END IF;
  UPDATE billguard.billing_records r
     SET status = CASE WHEN search THEN 'unknown' ELSE 'pending' END,
         attempts = r.attempts - 1, next_attempt_at = now(), lease_expires_at = NULL,
         updated_at = now()
   WHERE r.idempotency_key = key;
  RETURN 'released';
END $$;
