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
-- now, to be re-sent with their stored key. They are in the dispatch queue,
-- which the scan reads instead of the whole table.
CREATE FUNCTION billguard.requeue_abandoned() RETURNS bigint
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  AS $$
  WITH requeued AS (
    UPDATE billguard.billing_records
       SET next_attempt_at = now(), lease_expires_at = NULL, updated_at = now()
     WHERE status = 'dispatching' AND next_attempt_at IS NOT NULL
    RETURNING 1)
  SELECT count(*) FROM requeued;
$$;

-- The form body of a record's charge (extension/charge_request.cpp, over the
-- encoder of common/stripe_request.*); stored by the claim that first sends it.
-- A PaymentIntent says how it may be paid (automatic payment methods without
-- redirects), so it does not depend on the account's dashboard settings or
-- API version; records first sent with an older body keep it.
CREATE FUNCTION billguard.charge_request_body(endpoint text, idempotency_key text,
                                              customer_id text, billing_period text,
                                              amount_cents bigint, currency text,
                                              stripe_customer text, payment_method text)
  RETURNS text
  LANGUAGE c IMMUTABLE PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_charge_request_body_v2';

-- Claims up to max_rows due records: status 'dispatching', attempts + 1,
-- first_dispatched_at set once, a lease (lease_expires_at: a dispatching row
-- is due again once it has passed, or when it has none), and on its first
-- claim the request it sends for good: `endpoint` and the body built for
-- it. The claim leaves next_attempt_at as it is, so the record keeps its
-- place in the dispatch queue and the update stays HOT (no index entry).
-- action says what to send:
--   'charge'  POST the stored body to the stored endpoint with the key;
--   'search'  look the charge up first: the outcome of an earlier attempt
--             is unknown (a cached 500; unknown_cycles says how many the
--             record has had), or the record was claimed (created)
--             longer than idempotency_window ago, so Stripe may have pruned
--             the key of a request the record no longer knows it sent (a
--             backup restored from between that request and its recording
--             has no first_dispatched_at), or the scheduler claimed it
--             late (search_first_reason: a charge an earlier system
--             made for it may be one whose key Stripe has pruned).
-- Whatever the statistics say, the queue is read in due order from its
-- index and each claimed row is updated through its primary key.
CREATE FUNCTION billguard.claim_due_records(max_rows integer, lease interval,
                                            idempotency_window interval, endpoint text)
  RETURNS TABLE (idempotency_key text, attempt integer, action text, customer_id text,
                 billing_period text, stripe_endpoint text, request_body text,
                 unknown_cycles integer)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  SET enable_seqscan = off
  SET enable_bitmapscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  AS $$
#variable_conflict use_column
BEGIN
  -- The dispatcher commits its answers asynchronously (a lost answer is
  -- re-sent with the same key and replayed by Stripe), but a claim is
  -- flushed before any request leaves.
  PERFORM set_config('synchronous_commit', 'on', true);
  RETURN QUERY
  WITH due AS (
    SELECT r.idempotency_key, r.status, r.created_at, r.first_dispatched_at,
           r.search_first_reason
      FROM billguard.billing_records r
     WHERE r.next_attempt_at <= now() AND r.status IN ('pending', 'dispatching', 'unknown')
       AND (r.status <> 'dispatching' OR r.lease_expires_at IS NULL OR r.lease_expires_at <= now())
     ORDER BY r.next_attempt_at
     LIMIT max_rows
       FOR UPDATE SKIP LOCKED
  ), claimed AS (
    UPDATE billguard.billing_records r
       SET status = 'dispatching',
           attempts = r.attempts + 1,
           first_dispatched_at = coalesce(r.first_dispatched_at, now()),
           lease_expires_at = now() + lease,
           updated_at = now(),
           stripe_endpoint = coalesce(r.stripe_endpoint, endpoint),
           request_body = coalesce(r.request_body,
             billguard.charge_request_body(endpoint, r.idempotency_key, r.customer_id,
                                           r.billing_period, r.amount_cents, r.currency,
                                           r.stripe_customer, r.payment_method))
      FROM due
     WHERE r.idempotency_key = due.idempotency_key
    RETURNING r.idempotency_key, r.attempts, r.customer_id, r.billing_period,
              r.stripe_endpoint, r.request_body, r.unknown_cycles,
              CASE WHEN due.status = 'unknown'
                     OR least(due.created_at, due.first_dispatched_at) < now() - idempotency_window
                     OR due.search_first_reason IS NOT NULL
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
         c.stripe_endpoint, c.request_body, coalesce(c.unknown_cycles, 0)::integer
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
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN concat_ws(' ', detail ->> 'http_status',
                   nullif(concat_ws('/', detail ->> 'type', detail ->> 'code'), '') || ':',
                   detail ->> 'message');

-- Records a batch of answers the dispatcher read and judged
-- (common/stripe_response.cpp), in one statement: answers is a JSON array of
-- {key, attempt, search, outcome, http_status, charge_id, replayed,
-- request_id, error_type, error_code, decline_code, message, body_excerpt,
-- found}; found, of a search, lists the charged objects that carry the
-- record's key: [{id, amount, currency, customer}, ...].
-- What each outcome does to its record, and the event it journals (every
-- event that records an answer carries Stripe's Request-Id, what Stripe
-- support asks for):
--   an answer to a charge:
--     completed     charged: charge_id                      BillingCompleted
--     failed        not charged (a decline, a 4xx)           BillingFailed, terminal
--     retry         again after retry_delay(attempt)         BillingFailed, not terminal
--     throttled     a 429 or 409: the same, backoff capped at a minute
--     unknown       a cached 500: search after settle_delay,
--                   unknown_cycles + 1                       ChargeUnknown
--     needs_review  a person must look; never re-sent        NeedsReview
--     blocked       refused by billguard-proxy's spend cap (nothing was
--                   sent upstream); terminal, never re-sent   BillingBlocked
--     paused        the API key was refused: not counted     -
--     not_sent      never left: not counted, due again (the
--                   dispatcher holds off while Stripe is
--                   unreachable)                             ChargeNotSent
--   an answer to a search for the record's charge:
--     completed     found charged, with the record's amount, currency and
--                   Stripe customer (the key alone proves nothing: another
--                   database billing with the same key namespace on this
--                   Stripe account makes the same key): the first such
--                   object's id                             ChargeReconciled
--                   found, but none of those match: needs_review, never
--                   re-sent, last_error saying what differed (and a
--                   WARNING in the log)                      NeedsReview
--     absent        not found: nothing changes, the dispatcher sends the
--                   charge now with the same key and lease
--     needs_review  not found after max_unknown_cycles indeterminate
--                   answers: re-sending would only get the cached 500
--                   replayed; never re-sent                  NeedsReview
--     retry         the search told nothing: unknown, again after retry_delay
--     paused        the API key was refused: unknown, not counted
--     not_sent      never left: the same
-- A settled record (completed, failed, needs_review, blocked) leaves the dispatch
-- queue: its next_attempt_at becomes NULL. One result per answer, in
-- order: 'recorded', or 'stale' when the record is no longer that attempt's
-- (its lease was taken over, an operator requeued it: a late answer must not
-- overwrite a newer state), or 'locked' when another session holds its row:
-- the dispatcher never waits for a row, so one held lock cannot halt all
-- billing (see missed_attempt). Rows are found by their primary key alone,
-- the one plan whatever the statistics say (after a crash they say the
-- table is empty): the planner is held to index lookups in nested loops.
CREATE FUNCTION billguard.record_answers(answers jsonb, settle_delay interval)
  RETURNS TABLE (recorded text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  SET enable_seqscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  AS $$
#variable_conflict use_column
DECLARE
  unknown_outcome text;
  mismatch record;
BEGIN
  SELECT a.search || '/' || a.outcome INTO unknown_outcome
    FROM jsonb_to_recordset(answers) AS a(search boolean, outcome text)
   WHERE NOT coalesce(a.search IS NOT NULL AND a.outcome IN ('completed', 'retry', 'paused', 'not_sent')
                       OR a.search = false AND a.outcome IN ('failed', 'throttled', 'unknown', 'needs_review', 'blocked')
                       OR a.search AND a.outcome IN ('absent', 'needs_review'), false)
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'no such outcome of an answer (search/outcome): %', unknown_outcome
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY
  WITH answer AS (
    SELECT *
      FROM ROWS FROM (jsonb_to_recordset(answers) AS (
             key text, attempt integer, search boolean, outcome text, http_status integer,
             charge_id text, replayed boolean, request_id text, error_type text, error_code text,
             decline_code text, message text, body_excerpt text, found jsonb))
           WITH ORDINALITY AS a(key, attempt, search, outcome, http_status, charge_id, replayed,
                                request_id, error_type, error_code, decline_code, message,
                                body_excerpt, found, position)
  ), locked AS (
    SELECT r.idempotency_key, r.customer_id, r.billing_period, r.status, r.attempts,
           r.amount_cents, r.currency, r.stripe_customer
      FROM billguard.billing_records r
     WHERE r.idempotency_key IN (SELECT a.key FROM answer a)
       FOR UPDATE SKIP LOCKED
  ), mine AS (   -- the answers whose attempt is still their record's
    SELECT a.*, l.customer_id, l.billing_period, v.verified_charge,
           CASE WHEN a.search THEN 'search ' ELSE '' END
             || CASE WHEN a.search AND a.outcome = 'completed' AND v.verified_charge IS NULL
                     THEN 'mismatch' ELSE a.outcome END AS what,
           CASE WHEN a.search AND a.outcome = 'completed' AND v.verified_charge IS NULL THEN
             format('search found %s with the record''s key, but for %s %s of customer %s, not the '
                    'record''s %s %s of %s: another database or system bills with this key '
                    'namespace on this Stripe account',
                    coalesce(f.id, a.charge_id), coalesce(f.amount::text, '?'), coalesce(f.currency, '?'),
                    coalesce(f.customer, 'none'), l.amount_cents, l.currency, l.stripe_customer)
           END AS mismatch,
           jsonb_strip_nulls(jsonb_build_object(
             'http_status', nullif(a.http_status, 0), 'type', a.error_type, 'code', a.error_code,
             'decline_code', a.decline_code, 'message', a.message, 'body', a.body_excerpt,
             'request_id', a.request_id, 'attempt', a.attempt)) AS detail
      FROM answer a
      JOIN locked l ON l.idempotency_key = a.key AND l.status = 'dispatching' AND l.attempts = a.attempt
      -- The first object found that is the record's charge: its amount,
      -- currency and Stripe customer too, as a webhook's must be.
      LEFT JOIN LATERAL (
        SELECT c.id AS verified_charge
          FROM ROWS FROM (jsonb_to_recordset(coalesce(a.found, '[]'::jsonb)) AS (
                 id text, amount bigint, currency text, customer text)) WITH ORDINALITY AS c(id, amount, currency, customer, n)
         WHERE c.amount = l.amount_cents AND c.currency = l.currency AND c.customer = l.stripe_customer
         ORDER BY c.n LIMIT 1) v ON a.search AND a.outcome = 'completed'
      -- Else the first one found, to say what differed.
      LEFT JOIN LATERAL (
        SELECT c.id, c.amount, c.currency, c.customer
          FROM ROWS FROM (jsonb_to_recordset(coalesce(a.found, '[]'::jsonb)) AS (
                 id text, amount bigint, currency text, customer text)) WITH ORDINALITY AS c(id, amount, currency, customer, n)
         ORDER BY c.n LIMIT 1) f ON a.search AND a.outcome = 'completed' AND v.verified_charge IS NULL
  ), effect AS (
    SELECT m.key, m.customer_id, m.billing_period, m.what,
           CASE WHEN m.what = 'completed' THEN m.charge_id
                WHEN m.what = 'search completed' THEN m.verified_charge END AS charge_id,
           CASE m.what
             WHEN 'completed' THEN 'completed' WHEN 'search completed' THEN 'completed'
             WHEN 'failed' THEN 'failed' WHEN 'needs_review' THEN 'needs_review'
             WHEN 'search needs_review' THEN 'needs_review'
             WHEN 'search mismatch' THEN 'needs_review'
             WHEN 'blocked' THEN 'blocked'
             WHEN 'retry' THEN 'pending' WHEN 'throttled' THEN 'pending'
             WHEN 'paused' THEN 'pending' WHEN 'not_sent' THEN 'pending'
             WHEN 'search absent' THEN NULL   -- nothing changes
             ELSE 'unknown'                   -- unknown, search retry, search paused, search not_sent
           END AS status,
           -- an attempt that provably charged nothing and told nothing does not count
           CASE WHEN m.outcome IN ('paused', 'not_sent') THEN -1 ELSE 0 END AS attempts_delta,
           CASE m.what
             WHEN 'retry' THEN now() + billguard.retry_delay(m.attempt, 900::double precision)
             -- a rate limit or a key still in use backs off a minute at most
             WHEN 'throttled' THEN now() + billguard.retry_delay(m.attempt, 60::double precision)
             -- search is eventually consistent: "absent" only after the settle delay
             WHEN 'unknown' THEN now() + settle_delay
             WHEN 'search retry' THEN now() + billguard.retry_delay(m.attempt, 900::double precision)
             WHEN 'paused' THEN now() WHEN 'not_sent' THEN now()
             WHEN 'search paused' THEN now() WHEN 'search not_sent' THEN now()
           END AS next_attempt_at,   -- NULL: settled, out of the queue
           m.what IN ('paused', 'search paused', 'search not_sent') AS keeps_error,
           CASE
             WHEN m.what IN ('completed', 'search completed') THEN NULL
             WHEN m.what = 'not_sent' THEN 'not sent: ' || m.message
             WHEN m.what IN ('search retry', 'search needs_review') THEN m.message
             WHEN m.what = 'search mismatch' THEN m.mismatch
             ELSE billguard.error_text(m.detail)
           END AS last_error,
           CASE m.what
             WHEN 'completed' THEN 'BillingCompleted' WHEN 'search completed' THEN 'ChargeReconciled'
             WHEN 'failed' THEN 'BillingFailed' WHEN 'retry' THEN 'BillingFailed'
             WHEN 'throttled' THEN 'BillingFailed' WHEN 'unknown' THEN 'ChargeUnknown'
             WHEN 'needs_review' THEN 'NeedsReview' WHEN 'not_sent' THEN 'ChargeNotSent'
             WHEN 'search needs_review' THEN 'NeedsReview'
             WHEN 'search mismatch' THEN 'NeedsReview'
             WHEN 'blocked' THEN 'BillingBlocked'
           END AS event_type,
           CASE m.what
             WHEN 'completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'replayed', coalesce(m.replayed, false),
               'http_status', m.http_status, 'attempt', m.attempt, 'request_id', m.request_id))
             WHEN 'search completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'via', 'search', 'attempt', m.attempt,
               'request_id', m.request_id))
             WHEN 'failed' THEN m.detail || jsonb_build_object('terminal', true)
             WHEN 'retry' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'throttled' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'unknown' THEN m.detail
             WHEN 'needs_review' THEN m.detail
             WHEN 'search needs_review' THEN m.detail || jsonb_build_object('via', 'search')
             WHEN 'search mismatch' THEN m.detail || jsonb_build_object(
               'via', 'search', 'message', m.mismatch, 'found', m.found)
             WHEN 'blocked' THEN m.detail
             WHEN 'not_sent' THEN jsonb_build_object('attempt', m.attempt, 'message', m.message)
           END AS event
      FROM mine m
  ), updated AS (
    UPDATE billguard.billing_records r
       SET status = e.status,
           attempts = r.attempts + e.attempts_delta,
           unknown_cycles = CASE WHEN e.what = 'unknown'
                                 THEN least(coalesce(r.unknown_cycles, 0) + 1, 32767)
                                 ELSE r.unknown_cycles END,
           next_attempt_at = e.next_attempt_at,
           lease_expires_at = NULL,
           last_error = CASE WHEN e.keeps_error THEN r.last_error ELSE e.last_error END,
           charge_id = coalesce(e.charge_id, r.charge_id),
           completed_at = CASE WHEN e.status = 'completed' THEN now() ELSE r.completed_at END,
           updated_at = now()
      FROM effect e
     WHERE r.idempotency_key = e.key AND e.status IS NOT NULL
  ), journaled AS (
    -- The record's row lock serialises all writers of its entity, so
    -- max + 1 cannot race.
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    SELECT p.id,
           coalesce((SELECT max(j.seq_nr) FROM billguard.journal j WHERE j.persistence_id = p.id), 0) + 1,
           e.customer_id, e.event_type, e.event
      FROM effect e
     CROSS JOIN LATERAL (SELECT 'billing-' || e.customer_id || '-' || e.billing_period AS id) p
     WHERE e.event_type IS NOT NULL
  )
  SELECT CASE WHEN a.position IN (SELECT m.position FROM mine m) THEN 'recorded'
              WHEN a.key IN (SELECT l.idempotency_key FROM locked l) THEN 'stale'
              ELSE billguard.missed_attempt(a.key, a.attempt)
         END
    FROM answer a
   ORDER BY a.position;
  -- A search that found the key on another's charge is for a person: say so
  -- in the log as well (the dispatcher judged the answer 'completed').
  FOR mismatch IN
    SELECT r.customer_id, r.billing_period, r.last_error
      FROM jsonb_to_recordset(answers) AS a(key text, search boolean, outcome text)
      JOIN billguard.billing_records r ON r.idempotency_key = a.key
     WHERE a.search AND a.outcome = 'completed' AND r.status = 'needs_review'
       AND r.updated_at = now() AND r.last_error LIKE 'search found % with the record''s key, but %'
  LOOP
    RAISE WARNING 'billguard dispatcher: %/% is needs_review: %', mismatch.customer_id,
                  mismatch.billing_period, mismatch.last_error
      USING HINT = 'Every database billing through one Stripe account needs a billguard.key_namespace '
                   'of its own. Compare the record with Stripe''s dashboard, then resolve_record or '
                   'retry_record.';
  END LOOP;
END $$;

-- One answer to a charge (see record_answers).
CREATE FUNCTION billguard.record_charge_response(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    replayed boolean, request_id text, error_type text, error_code text, decline_code text,
    message text, body_excerpt text, settle_delay interval)
  RETURNS text
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT a.recorded FROM billguard.record_answers(jsonb_build_array(jsonb_build_object(
            'key', key, 'attempt', attempt, 'search', false, 'outcome', outcome,
            'http_status', http_status, 'charge_id', charge_id, 'replayed', replayed,
            'request_id', request_id, 'error_type', error_type, 'error_code', error_code,
            'decline_code', decline_code, 'message', message, 'body_excerpt', body_excerpt)),
          settle_delay) a);

-- One answer to a search for the record's charge (see record_answers):
-- charge_id the object found, with its amount, currency and Stripe customer.
CREATE FUNCTION billguard.record_search_result(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    request_id text, message text, found_amount bigint DEFAULT NULL,
    found_currency text DEFAULT NULL, found_customer text DEFAULT NULL)
  RETURNS text
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT a.recorded FROM billguard.record_answers(jsonb_build_array(jsonb_build_object(
            'key', key, 'attempt', attempt, 'search', true, 'outcome', outcome,
            'http_status', http_status, 'charge_id', charge_id, 'request_id', request_id,
            'message', message,
            'found', CASE WHEN charge_id IS NULL THEN '[]'::jsonb
                          ELSE jsonb_build_array(jsonb_build_object(
                                 'id', charge_id, 'amount', found_amount, 'currency', found_currency,
                                 'customer', found_customer)) END)),
          NULL::interval) a);

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
