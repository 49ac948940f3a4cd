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
CREATE OR REPLACE FUNCTION billguard.record_answers(answers jsonb, settle_delay interval)
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
