-- 10_dispatch_queue.sql: the dispatch queue at the SQL level, no worker.
--
-- Proves:
--  claim_due_records  claims only due rows (pending/unknown/dispatching with
--      an expired lease, next_attempt_at <= now()), oldest first, at most
--      max_rows; sets dispatching, attempts + 1, a lease (next_attempt_at, the
--      record's place in the queue, untouched), first_dispatched_at
--      once (kept on re-claim); writes ChargeAttempted (attempt, action,
--      key); action 'search' for unknown rows and for rows first dispatched
--      longer ago than the idempotency window, else 'charge'; a row locked by
--      another session is skipped without waiting (SKIP LOCKED, via dblink
--      on a briefly committed row that is removed again), and an answer for
--      it is 'locked' at once, recorded once the lock is gone.
--  record_charge_response  each outcome the dispatcher judged (the
--      judgement itself is unit-tested, test/unit/stripe_response_test.cpp):
--      completed (charge id, BillingCompleted, out of the queue), failed
--      (terminal BillingFailed, out of the queue), needs_review (NeedsReview,
--      out of the queue, an unreadable body kept as
--      text), retry (pending, backoff, BillingFailed not terminal), unknown
--      (settle delay, ChargeUnknown), paused and not_sent (the attempt not
--      counted; ChargeNotSent); every event carries the Request-Id; a stale
--      attempt -> 'stale' and nothing changes.
--  record_search_result  completed (ChargeReconciled) when the object found
--      has the record's amount, currency and Stripe customer; one that
--      differs in any of them (or says nothing of them) is needs_review,
--      out of the queue, last_error saying what differed (NeedsReview via
--      search, the object in the event), and of several found the first that
--      matches is taken; absent (nothing
--      changes: the charge is sent next), needs_review (the dispatcher's
--      max_unknown_cycles reached: settled, NeedsReview via search, the
--      reason in last_error), retry (unknown, backoff), paused and not_sent
--      (unknown, not counted); stale. An 'unknown' answer counts one more
--      unknown cycle, claim_due_records returns the count, and retry_record
--      clears it.
--  release_claim  an unsent claim goes back (pending, or unknown for a
--      search), the attempt not counted; stale otherwise.
--  retry_record / resolve_record  allowed statuses, 22023 / P0002
--      otherwise, events RecordRequeued / ReviewResolved.
BEGIN;
SELECT plan(138);

-- Other suites' rows (if any) must not be claimed here.
UPDATE billguard.billing_records SET next_attempt_at = 'infinity'
 WHERE customer_id NOT LIKE 't10\_%' AND status IN ('pending', 'dispatching', 'unknown');

INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
SELECT 't10_' || n, 'cus_t10_' || n, 1000 + row_number() OVER (), CASE WHEN n = 'due2' THEN 'eur' ELSE 'usd' END,
       CASE WHEN n = 'due2' THEN NULL ELSE 'pm_card_visa' END
  FROM unnest(ARRAY[
    'due1', 'due2', 'later', 'done', 'failed', 'review', 'blocked', 'unknown', 'old', 'expired', 'leased',
    'spare',
    'r200', 'r200b', 'r200noid', 'r402', 'r400', 'r409', 'r429', 'r503', 'r503last', 'r500', 'r401', 'r403',
    'srtrue', 'srfalse', 'sr500false', 'r502html', 'stale',
    'net', 'netlast', 'netstale',
    'sfound', 'scustomer', 'samount', 'scurrency', 'ssecond', 'sunsaid', 'sproc', 'spaid', 'snone', 'sother', 'sdeclined', 'serr', 'shtml', 's401', 'sstale', 'scycles',
    'rel_charge', 'rel_search', 'rel_stale',
    'rt_failed', 'rt_review', 'rt_pending', 'rt_completed', 'rt_unknown', 'rt_dispatching', 'rt_blocked',
    'rs_review', 'rs_failed', 'rs_unknown', 'rs_pending', 'rs_completed', 'rs_dispatching', 'rs_blocked'
  ]) AS n;
DO $$ BEGIN
  PERFORM billguard.bill_customer(customer_id, '2031-10') FROM billguard.accounts WHERE customer_id LIKE 't10\_%';
END $$;
UPDATE billguard.billing_records SET next_attempt_at = 'infinity' WHERE customer_id LIKE 't10\_%';

-- Helpers (pg_temp: gone with the session).
CREATE FUNCTION pg_temp.t10_r(c text) RETURNS billguard.billing_records LANGUAGE sql AS $$
  SELECT * FROM billguard.billing_records r WHERE r.customer_id = 't10_' || c AND r.billing_period = '2031-10' $$;
CREATE FUNCTION pg_temp.t10_key(c text) RETURNS text LANGUAGE sql AS $$
  SELECT billguard.idempotency_key('t10_' || c, '2031-10') $$;
CREATE FUNCTION pg_temp.t10_nevents(c text) RETURNS bigint LANGUAGE sql AS $$
  SELECT count(*) FROM billguard.journal j WHERE j.persistence_id = 'billing-t10_' || c || '-2031-10' $$;
CREATE FUNCTION pg_temp.t10_last_type(c text) RETURNS text LANGUAGE sql AS $$
  SELECT j.event_type FROM billguard.journal j WHERE j.persistence_id = 'billing-t10_' || c || '-2031-10'
   ORDER BY j.seq_nr DESC LIMIT 1 $$;
CREATE FUNCTION pg_temp.t10_last(c text) RETURNS jsonb LANGUAGE sql AS $$
  SELECT j.event FROM billguard.journal j WHERE j.persistence_id = 'billing-t10_' || c || '-2031-10'
   ORDER BY j.seq_nr DESC LIMIT 1 $$;
-- The state right after a claim of attempt n (claim_due_records itself is
-- tested below): dispatching, attempts = n, leased.
CREATE FUNCTION pg_temp.t10_dispatching(c text, n integer) RETURNS text LANGUAGE sql AS $$
  UPDATE billguard.billing_records r
     SET status = 'dispatching', attempts = n, first_dispatched_at = coalesce(r.first_dispatched_at, now()),
         lease_expires_at = now() + interval '40 seconds', next_attempt_at = now() + interval '40 seconds'
   WHERE r.customer_id = 't10_' || c AND r.billing_period = '2031-10'
  RETURNING r.idempotency_key $$;
CREATE FUNCTION pg_temp.t10_set(c text, new_status text) RETURNS void LANGUAGE sql AS $$
  UPDATE billguard.billing_records r
     SET status = new_status, charge_id = CASE WHEN new_status = 'completed' THEN 'pi_t10' || c END,
         next_attempt_at = CASE WHEN new_status IN ('pending', 'dispatching', 'unknown') THEN 'infinity' ELSE r.next_attempt_at END,
         last_error = CASE WHEN new_status IN ('failed', 'needs_review') THEN 'earlier error' END
   WHERE r.customer_id = 't10_' || c AND r.billing_period = '2031-10' $$;
-- Claims inside a subtransaction that is rolled back: which rows would be claimed.
CREATE FUNCTION pg_temp.t10_claim_undone(n integer) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  claimed text;
BEGIN
  BEGIN
    SELECT string_agg(c.customer_id, ',' ORDER BY c.customer_id) INTO claimed
      FROM billguard.claim_due_records(n, interval '30 seconds', interval '1 day', '/v1/payment_intents') c;
    RAISE EXCEPTION 't10 undo';
  EXCEPTION WHEN raise_exception THEN
    NULL;
  END;
  RETURN claimed;
END $$;

------------------------------------------------------------------------------
-- claim_due_records
UPDATE billguard.billing_records SET next_attempt_at = '1999-01-01' WHERE customer_id = 't10_due1';
UPDATE billguard.billing_records SET next_attempt_at = '2000-01-01' WHERE customer_id = 't10_due2';
UPDATE billguard.billing_records SET next_attempt_at = now() + interval '1 hour' WHERE customer_id = 't10_later';
UPDATE billguard.billing_records SET status = 'completed', charge_id = 'pi_t10done', next_attempt_at = '2000-01-01'
 WHERE customer_id = 't10_done';
UPDATE billguard.billing_records SET status = 'failed', next_attempt_at = '2000-01-01' WHERE customer_id = 't10_failed';
UPDATE billguard.billing_records SET status = 'needs_review', next_attempt_at = '2000-01-01' WHERE customer_id = 't10_review';
UPDATE billguard.billing_records SET status = 'blocked', next_attempt_at = '2000-01-01' WHERE customer_id = 't10_blocked';
UPDATE billguard.billing_records SET status = 'unknown', attempts = 1, first_dispatched_at = now() - interval '10 minutes',
       next_attempt_at = '2000-01-01' WHERE customer_id = 't10_unknown';
UPDATE billguard.billing_records SET attempts = 2, first_dispatched_at = now() - interval '2 days',
       next_attempt_at = '2000-01-01' WHERE customer_id = 't10_old';
UPDATE billguard.billing_records SET status = 'dispatching', attempts = 1, first_dispatched_at = now() - interval '5 minutes',
       lease_expires_at = now() - interval '1 second', next_attempt_at = now() - interval '1 second'
 WHERE customer_id = 't10_expired';
UPDATE billguard.billing_records SET status = 'dispatching', attempts = 1, first_dispatched_at = now() - interval '5 minutes',
       lease_expires_at = now() + interval '20 seconds', next_attempt_at = now() + interval '20 seconds'
 WHERE customer_id = 't10_leased';

SET LOCAL synchronous_commit = off;    -- the dispatcher's session setting: answers commit asynchronously
CREATE TEMP TABLE t10_c1 AS SELECT * FROM billguard.claim_due_records(1, interval '30 seconds', interval '1 day', '/v1/payment_intents');
SELECT is(current_setting('synchronous_commit'), 'on',
          'a claim''s transaction commits with synchronous_commit on: flushed before any request leaves');
SELECT results_eq($$SELECT customer_id, attempt, action FROM t10_c1$$,
                  $$VALUES ('t10_due1', 1, 'charge')$$,
                  'claim (max_rows 1): the most overdue row, attempt 1, action charge');

CREATE TEMP TABLE t10_c2 AS SELECT * FROM billguard.claim_due_records(100, interval '30 seconds', interval '1 day', '/v1/payment_intents');
SELECT results_eq($$SELECT customer_id, attempt, action FROM t10_c2 ORDER BY customer_id$$,
                  $$VALUES ('t10_due2', 1, 'charge'), ('t10_expired', 2, 'charge'), ('t10_old', 3, 'search'),
                           ('t10_unknown', 2, 'search')$$,
                  'claim: exactly the due rows (pending, unknown, expired lease); search for unknown and for a first dispatch older than the window');
SELECT results_eq($$SELECT idempotency_key, billing_period, stripe_endpoint, request_body
                      FROM t10_c2 WHERE customer_id = 't10_due2'$$,
                  $$SELECT pg_temp.t10_key('due2'), '2031-10', '/v1/payment_intents',
                           billguard.charge_request_body('/v1/payment_intents', pg_temp.t10_key('due2'), 't10_due2', '2031-10',
                             (SELECT amount_cents FROM billguard.accounts WHERE customer_id = 't10_due2'), 'eur', 'cus_t10_due2', NULL)$$,
                  'claim returns the stored key, period, and the request it stored: endpoint and body');
SELECT results_eq($$SELECT customer_id, status, attempts, lease_expires_at, next_attempt_at
                      FROM billguard.billing_records WHERE customer_id IN ('t10_due1', 't10_due2', 't10_expired', 't10_old', 't10_unknown')
                     ORDER BY customer_id$$,
                  $$VALUES ('t10_due1', 'dispatching', 1, now() + interval '30 seconds', '1999-01-01'::timestamptz),
                           ('t10_due2', 'dispatching', 1, now() + interval '30 seconds', '2000-01-01'),
                           ('t10_expired', 'dispatching', 2, now() + interval '30 seconds', now() - interval '1 second'),
                           ('t10_old', 'dispatching', 3, now() + interval '30 seconds', '2000-01-01'),
                           ('t10_unknown', 'dispatching', 2, now() + interval '30 seconds', '2000-01-01')$$,
                  'claimed rows: dispatching, attempts + 1, leased until now() + lease, their next_attempt_at (their place in the queue) untouched');
SELECT results_eq($$SELECT customer_id, first_dispatched_at FROM billguard.billing_records
                     WHERE customer_id IN ('t10_due1', 't10_due2', 't10_expired', 't10_old', 't10_unknown') ORDER BY customer_id$$,
                  $$VALUES ('t10_due1', now()), ('t10_due2', now()), ('t10_expired', now() - interval '5 minutes'),
                           ('t10_old', now() - interval '2 days'), ('t10_unknown', now() - interval '10 minutes')$$,
                  'first_dispatched_at is set on the first claim and kept on later ones');
SELECT results_eq($$SELECT customer_id, status, attempts FROM billguard.billing_records
                     WHERE customer_id IN ('t10_later', 't10_done', 't10_failed', 't10_review', 't10_blocked', 't10_leased')
                     ORDER BY customer_id$$,
                  $$VALUES ('t10_blocked', 'blocked', 0), ('t10_done', 'completed', 0), ('t10_failed', 'failed', 0),
                           ('t10_later', 'pending', 0), ('t10_leased', 'dispatching', 1), ('t10_review', 'needs_review', 0)$$,
                  'not claimed: not yet due, completed, failed, needs_review, blocked, a live lease');
SELECT is((SELECT count(*) FROM billguard.journal WHERE event_type = 'ChargeAttempted'
            AND customer_id IN ('t10_later', 't10_done', 't10_failed', 't10_review', 't10_blocked', 't10_leased')),
          0::bigint, 'no ChargeAttempted for rows not claimed');
SELECT results_eq($$SELECT customer_id, seq_nr, (event ->> 'attempt')::int, event ->> 'action', event ->> 'idempotency_key',
                           (event ->> 'at')::timestamptz
                      FROM billguard.journal WHERE event_type = 'ChargeAttempted' AND customer_id LIKE 't10\_%'
                     ORDER BY customer_id$$,
                  $$VALUES ('t10_due1', 2::bigint, 1, 'charge', pg_temp.t10_key('due1'), now()),
                           ('t10_due2', 2::bigint, 1, 'charge', pg_temp.t10_key('due2'), now()),
                           ('t10_expired', 2::bigint, 2, 'charge', pg_temp.t10_key('expired'), now()),
                           ('t10_old', 2::bigint, 3, 'search', pg_temp.t10_key('old'), now()),
                           ('t10_unknown', 2::bigint, 2, 'search', pg_temp.t10_key('unknown'), now())$$,
                  'one ChargeAttempted per claim: attempt, action, the stored key, at');
SELECT is((SELECT count(*) FROM billguard.claim_due_records(100, interval '30 seconds', interval '1 day', '/v1/payment_intents')), 0::bigint,
          'claiming again at once: nothing is due (leases)');

-- Re-claim after the lease expired: attempts 2, first_dispatched_at kept.
UPDATE billguard.billing_records SET lease_expires_at = now() - interval '1 second',
       first_dispatched_at = now() - interval '1 hour' WHERE customer_id = 't10_due1';
SELECT results_eq($$SELECT customer_id, attempt, action FROM billguard.claim_due_records(100, interval '30 seconds', interval '1 day', '/v1/payment_intents')$$,
                  $$VALUES ('t10_due1', 2, 'charge')$$, 're-claim after the lease: attempt 2, still a charge inside the window');
SELECT is((pg_temp.t10_r('due1')).first_dispatched_at, now() - interval '1 hour', 're-claim keeps first_dispatched_at');
SELECT is((SELECT (event ->> 'attempt')::int FROM billguard.journal WHERE persistence_id = 'billing-t10_due1-2031-10' AND seq_nr = 3),
          2, 're-claim writes ChargeAttempted attempt 2 at seq_nr 3');
UPDATE billguard.billing_records SET lease_expires_at = now() - interval '1 second' WHERE customer_id = 't10_due1';
SELECT results_eq($$SELECT customer_id, attempt, action FROM billguard.claim_due_records(100, interval '30 seconds', interval '30 minutes', '/v1/payment_intents')$$,
                  $$VALUES ('t10_due1', 3, 'search')$$,
                  'first dispatched 1 hour ago, window 30 minutes: search first');
UPDATE billguard.billing_records SET next_attempt_at = now() - interval '1 second', created_at = now() - interval '2 days'
 WHERE customer_id = 't10_spare';
SELECT results_eq($$SELECT customer_id, attempt, action FROM billguard.claim_due_records(100, interval '30 seconds', interval '1 day', '/v1/payment_intents')$$,
                  $$VALUES ('t10_spare', 1, 'search')$$,
                  'never dispatched, but claimed (created) 2 days ago, window 1 day: search first (a restored backup)');
UPDATE billguard.billing_records SET status = 'pending', attempts = 0, next_attempt_at = '1995-01-01', created_at = now(),
       first_dispatched_at = NULL WHERE customer_id = 't10_spare';

------------------------------------------------------------------------------
-- SKIP LOCKED: a row committed by another session and locked by a third is
-- skipped, not waited for, by claims and by the recording of answers. The
-- row is committed for this check only and removed again after the test's
-- transaction (its table refuses DELETE, in replica mode too: the trigger
-- is disabled for the clean-up).
CREATE EXTENSION IF NOT EXISTS dblink;
SELECT is(dblink_connect('t10_locker', format('host=%s port=%s dbname=%s user=%s',
            coalesce(nullif(split_part(current_setting('unix_socket_directories'), ',', 1), ''), '127.0.0.1'),
            current_setting('port'), current_database(), current_user)),
          'OK', 'SKIP LOCKED: a second session connects (dblink)');
SELECT is((SELECT n FROM dblink('t10_locker', $$SELECT count(*) FROM billguard.billing_records
                                               WHERE customer_id = 't10_skiplocked'$$) AS t(n bigint)), 0::bigint,
          '(no row left over from an earlier run)');
SELECT is(dblink_exec('t10_locker', $$INSERT INTO billguard.billing_records
            (customer_id, billing_period, idempotency_key, amount_cents, currency, stripe_customer, status, attempts,
             next_attempt_at)
            VALUES ('t10_skiplocked', '2031-10', billguard.idempotency_key('t10_skiplocked', '2031-10'), 100, 'usd',
                    'cus_t10_skiplocked', 'dispatching', 1, '1990-01-01')$$),
          'INSERT 0 1', 'SKIP LOCKED: a dispatching row (attempt 1) whose lease expired, the most overdue, is committed');
UPDATE billguard.billing_records SET next_attempt_at = '1995-01-01' WHERE customer_id = 't10_spare';
SELECT is(pg_temp.t10_claim_undone(1), 't10_skiplocked', 'SKIP LOCKED: unlocked, it is the row a claim of 1 takes');
SELECT is(dblink_exec('t10_locker', 'BEGIN'), 'BEGIN', 'SKIP LOCKED: the second session begins');
SELECT is((SELECT c FROM dblink('t10_locker', $$SELECT customer_id FROM billguard.billing_records
                                               WHERE customer_id = 't10_skiplocked' FOR UPDATE$$) AS t(c text)),
          't10_skiplocked', 'SKIP LOCKED: the second session locks the row');
SET LOCAL statement_timeout = '5s';
CREATE TEMP TABLE t10_skip AS SELECT * FROM billguard.claim_due_records(1, interval '30 seconds', interval '1 day', '/v1/payment_intents');
RESET statement_timeout;
SELECT results_eq($$SELECT customer_id FROM t10_skip$$, $$VALUES ('t10_spare')$$,
                  'SKIP LOCKED: the claim skips the locked row at once and takes the next due one');
SET LOCAL statement_timeout = '5s';
SELECT is(billguard.record_charge_response(pg_temp.t10_key('skiplocked'), 1, 'completed', 200, 'pi_t10locked', false,
            'req_t10', NULL, NULL, NULL, NULL, NULL, '2 minutes')
          || '/' || billguard.record_search_result(pg_temp.t10_key('skiplocked'), 1, 'retry', 500, NULL, 'req_t10',
            'search failed with HTTP 500'),
          'locked/locked', 'SKIP LOCKED: an answer and a search result for the locked record: locked, at once');
RESET statement_timeout;
SELECT results_eq($$SELECT status, attempts, charge_id FROM billguard.billing_records WHERE customer_id = 't10_skiplocked'$$,
                  $$VALUES ('dispatching', 1, NULL::text)$$, 'SKIP LOCKED: the locked row is untouched');
SELECT is(dblink_exec('t10_locker', 'ROLLBACK'), 'ROLLBACK', 'SKIP LOCKED: the second session lets go');
SAVEPOINT t10_unlocked;
SELECT is(billguard.record_charge_response(pg_temp.t10_key('skiplocked'), 1, 'completed', 200, 'pi_t10locked', false,
            'req_t10', NULL, NULL, NULL, NULL, NULL, '2 minutes'),
          'recorded', 'SKIP LOCKED: once the lock is gone the same answer is recorded');
ROLLBACK TO SAVEPOINT t10_unlocked;
SELECT is(dblink_disconnect('t10_locker'), 'OK', '(the second session disconnects)');

------------------------------------------------------------------------------
-- record_charge_response(key, attempt, outcome, http_status, charge_id, replayed, request_id,
--   error_type, error_code, decline_code, message, body_excerpt, settle_delay, unsent_delay):
-- the dispatcher judged the answer (common/stripe_response.cpp, unit-tested);
-- SQL records each outcome.
CREATE FUNCTION pg_temp.t10_answer(c text, attempt int, outcome text, http_status int, charge_id text DEFAULT NULL,
                                   error_type text DEFAULT NULL, error_code text DEFAULT NULL,
                                   message text DEFAULT NULL, body text DEFAULT NULL) RETURNS text LANGUAGE sql AS $$
  SELECT billguard.record_charge_response(pg_temp.t10_key(c), attempt, outcome, http_status, charge_id,
           true, 'req_t10' || c, error_type, error_code,
           CASE WHEN error_code = 'card_declined' THEN 'generic_decline' END, message, body,
           interval '7 minutes') $$;

-- completed
SELECT is(pg_temp.t10_answer('r200', (SELECT 2 FROM pg_temp.t10_dispatching('r200', 2)), 'completed', 200, 'pi_t10r200'),
          'recorded', 'completed: recorded');
SELECT results_eq($$SELECT status, charge_id, completed_at, lease_expires_at, last_error, attempts, next_attempt_at
                      FROM pg_temp.t10_r('r200')$$,
                  $$VALUES ('completed', 'pi_t10r200', now(), NULL::timestamptz, NULL::text, 2, NULL::timestamptz)$$,
                  'completed: the record is completed with the id, now, no lease, no error, out of the queue');
SELECT is(pg_temp.t10_last_type('r200'), 'BillingCompleted', 'completed: BillingCompleted');
SELECT is(pg_temp.t10_last('r200'),
          '{"charge_id": "pi_t10r200", "replayed": true, "http_status": 200, "attempt": 2, "request_id": "req_t10r200"}'::jsonb,
          'BillingCompleted carries charge_id, replayed, http_status, attempt and Stripe''s Request-Id');

-- failed
SELECT is(pg_temp.t10_answer('r402', (SELECT 1 FROM pg_temp.t10_dispatching('r402', 1)), 'failed', 402, NULL,
            'card_error', 'card_declined', 'Your card was declined.'),
          'recorded', 'failed: recorded');
SELECT results_eq($$SELECT status, charge_id, last_error, lease_expires_at, next_attempt_at FROM pg_temp.t10_r('r402')$$,
                  $$VALUES ('failed', NULL::text, '402 card_error/card_declined: Your card was declined.', NULL::timestamptz,
                            NULL::timestamptz)$$,
                  'failed: last_error "402 card_error/card_declined: ...", out of the queue');
SELECT is(pg_temp.t10_last('r402'),
          '{"http_status": 402, "type": "card_error", "code": "card_declined", "decline_code": "generic_decline",
            "message": "Your card was declined.", "request_id": "req_t10r402", "attempt": 1, "terminal": true}'::jsonb,
          'failed: BillingFailed terminal, with the Stripe error and the Request-Id');

-- needs_review
SELECT is(pg_temp.t10_answer('r400', (SELECT 1 FROM pg_temp.t10_dispatching('r400', 1)), 'needs_review', 400, NULL,
            'idempotency_error', NULL, 'Keys for idempotent requests can only be used with the same parameters.'),
          'recorded', 'needs_review: recorded');
SELECT results_eq($$SELECT status, lease_expires_at, last_error, next_attempt_at FROM pg_temp.t10_r('r400')$$,
                  $$VALUES ('needs_review', NULL::timestamptz,
                            '400 idempotency_error: Keys for idempotent requests can only be used with the same parameters.',
                            NULL::timestamptz)$$,
                  'needs_review: no lease, last_error, out of the queue');
SELECT is(pg_temp.t10_last_type('r400') || ' ' || (pg_temp.t10_last('r400') ->> 'request_id'), 'NeedsReview req_t10r400',
          'needs_review: NeedsReview with the Request-Id');
SELECT is(pg_temp.t10_answer('r200noid', (SELECT 1 FROM pg_temp.t10_dispatching('r200noid', 1)), 'needs_review', 200, NULL,
            'api_error', NULL, 'success response without an object id', '{"object": 1e1000000}'),
          'recorded', 'needs_review of an unreadable 2xx: recorded');
SELECT is(pg_temp.t10_last('r200noid') ->> 'body', '{"object": 1e1000000}',
          'an unreadable body is kept as text in the event, for people (never parsed)');

-- retry
SELECT is(pg_temp.t10_answer('r503', (SELECT 1 FROM pg_temp.t10_dispatching('r503', 1)), 'retry', 503, NULL,
            'api_error', NULL, 'unavailable'),
          'recorded', 'retry: recorded');
SELECT results_eq($$SELECT status, attempts, lease_expires_at, next_attempt_at > now(), last_error FROM pg_temp.t10_r('r503')$$,
                  $$VALUES ('pending', 1, NULL::timestamptz, true, '503 api_error: unavailable')$$,
                  'retry: pending, the attempt counted, due after a backoff, last_error');
SELECT is(pg_temp.t10_last('r503'),
          '{"http_status": 503, "type": "api_error", "message": "unavailable", "request_id": "req_t10r503", "attempt": 1, "terminal": false}'::jsonb,
          'retry: BillingFailed, not terminal');
SELECT is(billguard.record_charge_response(pg_temp.t10_dispatching('net', 1), 1, 'retry', 0, NULL, false, NULL, 'network', NULL,
            NULL, 'Operation timed out after 30000 milliseconds', NULL, '7 minutes'),
          'recorded', 'retry after a timeout: recorded');
SELECT results_eq($$SELECT status, next_attempt_at > now(), last_error FROM pg_temp.t10_r('net')$$,
                  $$VALUES ('pending', true, 'network: Operation timed out after 30000 milliseconds')$$,
                  'retry after a timeout: pending, backoff, last_error "network: ..."');
SELECT is(pg_temp.t10_last('net'),
          '{"type": "network", "message": "Operation timed out after 30000 milliseconds", "attempt": 1, "terminal": false}'::jsonb,
          'retry after a timeout: BillingFailed type network, not terminal');

-- unknown
SELECT is(pg_temp.t10_answer('r500', (SELECT 1 FROM pg_temp.t10_dispatching('r500', 1)), 'unknown', 500, NULL,
            'api_error', NULL, 'An unknown error occurred'),
          'recorded', 'unknown: recorded');
SELECT results_eq($$SELECT status, next_attempt_at, lease_expires_at, charge_id, last_error FROM pg_temp.t10_r('r500')$$,
                  $$VALUES ('unknown', now() + interval '7 minutes', NULL::timestamptz, NULL::text,
                            '500 api_error: An unknown error occurred')$$,
                  'unknown: next_attempt_at = now() + settle delay, no charge id');
SELECT is(pg_temp.t10_last_type('r500') || ' ' || (pg_temp.t10_last('r500') ->> 'request_id'), 'ChargeUnknown req_t10r500',
          'unknown: ChargeUnknown with the Request-Id');
SELECT is((pg_temp.t10_r('r500')).unknown_cycles, 1::smallint, 'unknown: one unknown cycle counted');

-- paused
SELECT is(pg_temp.t10_answer('r401', (SELECT 4 FROM pg_temp.t10_dispatching('r401', 4)), 'paused', 401, NULL,
            'invalid_request_error', NULL, 'Invalid API Key provided: sk_test_****'),
          'recorded', 'paused: recorded');
SELECT results_eq($$SELECT status, attempts, next_attempt_at, lease_expires_at, last_error FROM pg_temp.t10_r('r401')$$,
                  $$VALUES ('pending', 3, now(), NULL::timestamptz, NULL::text)$$,
                  'paused: pending, due now, the attempt not counted, no error recorded');
SELECT is(pg_temp.t10_nevents('r401'), 1::bigint, 'paused: no event');

-- not_sent
SELECT is(billguard.record_charge_response(pg_temp.t10_dispatching('netlast', 3), 3, 'not_sent', 0, NULL, false, NULL, 'network',
            NULL, NULL, 'Failed to connect to 127.0.0.1 port 9: Connection refused', NULL, '7 minutes'),
          'recorded', 'not_sent: recorded');
SELECT results_eq($$SELECT status, attempts, next_attempt_at, lease_expires_at, last_error FROM pg_temp.t10_r('netlast')$$,
                  $$VALUES ('pending', 2, now(), NULL::timestamptz,
                            'not sent: Failed to connect to 127.0.0.1 port 9: Connection refused')$$,
                  'not_sent: pending, the attempt not counted, due again (the dispatcher holds off while Stripe is unreachable)');
SELECT is(pg_temp.t10_last('netlast'),
          '{"attempt": 3, "message": "Failed to connect to 127.0.0.1 port 9: Connection refused"}'::jsonb,
          'not_sent: a ChargeNotSent event');
SELECT is(pg_temp.t10_last_type('netlast'), 'ChargeNotSent', 'not_sent: ChargeNotSent');

-- Stale attempts change nothing
CREATE TEMP TABLE t10_stale_key AS SELECT pg_temp.t10_dispatching('stale', 3) AS key;
CREATE TEMP TABLE t10_stale_before AS SELECT * FROM pg_temp.t10_r('stale');
SELECT is(pg_temp.t10_answer('stale', 2, 'completed', 200, 'pi_t10stale'), 'stale',
          'an answer to attempt 2 of a record at attempt 3: stale');
SELECT is(pg_temp.t10_answer('stale', 4, 'failed', 402, NULL, 'card_error'), 'stale',
          'an answer to a later attempt number: stale');
SELECT is(pg_temp.t10_answer('r200', 2, 'unknown', 500), 'stale', 'an answer to a completed record (its attempt): stale');
SELECT is(billguard.record_search_result(pg_temp.t10_key('stale'), 2, 'absent', 200, NULL, NULL, NULL), 'stale',
          'a search result for a stale attempt: stale');
SELECT is(billguard.record_charge_response('0123456789abcdef0123456789abcdef', 1, 'completed', 200, 'pi_x', false, NULL, NULL,
            NULL, NULL, NULL, NULL, '2 minutes'),
          'stale', 'an answer for a key without a record: stale');
SELECT results_eq($$SELECT to_jsonb(r) FROM pg_temp.t10_r('stale') r$$, $$SELECT to_jsonb(b) FROM t10_stale_before b$$,
                  'stale answers: the record is unchanged');
SELECT is(pg_temp.t10_nevents('stale'), 1::bigint, 'stale answers: no event');
SELECT results_eq($$SELECT status, charge_id FROM pg_temp.t10_r('r200')$$, $$VALUES ('completed', 'pi_t10r200')$$,
                  'stale answer to a completed record: still completed with its id');

-- record_answers: the dispatcher's batch, one statement for all the answers
-- that arrived together (the functions above are its one-answer case).
SELECT results_eq($$SELECT recorded FROM billguard.record_answers(jsonb_build_array(
                      jsonb_build_object('key', pg_temp.t10_dispatching('r200b', 1), 'attempt', 1, 'search', false,
                                         'outcome', 'completed', 'http_status', 200, 'charge_id', 'pi_t10r200b',
                                         'replayed', false, 'request_id', 'req_t10r200b'),
                      jsonb_build_object('key', pg_temp.t10_key('stale'), 'attempt', 2, 'search', false,
                                         'outcome', 'completed', 'http_status', 200, 'charge_id', 'pi_t10stale'),
                      jsonb_build_object('key', '0123456789abcdef0123456789abcdef', 'attempt', 1, 'search', true,
                                         'outcome', 'absent', 'http_status', 200)), '2 minutes')$$,
                  $$VALUES ('recorded'), ('stale'), ('stale')$$,
                  'record_answers: one result per answer, in order: recorded, stale, no such record');
SELECT results_eq($$SELECT r.status, r.charge_id, r.next_attempt_at, j.event_type, j.event ->> 'request_id'
                      FROM pg_temp.t10_r('r200b') r
                      JOIN billguard.journal j ON j.persistence_id = 'billing-t10_r200b-2031-10' AND j.seq_nr = 2$$,
                  $$VALUES ('completed', 'pi_t10r200b', NULL::timestamptz, 'BillingCompleted', 'req_t10r200b')$$,
                  'record_answers: the recorded answer of the batch is recorded as alone');
SELECT throws_ok($$SELECT * FROM billguard.record_answers('[{"key": "k", "attempt": 1, "search": true, "outcome": "failed"}]', '2 minutes')$$,
                 '22023', 'no such outcome of an answer (search/outcome): true/failed',
                 'record_answers refuses an outcome that does not exist (a search cannot fail): 22023');

------------------------------------------------------------------------------
-- record_search_result(key, attempt, outcome, http_status, charge_id, request_id, message, unsent_delay)
CREATE FUNCTION pg_temp.t10_search(c text, attempt int, outcome text, http_status int, charge_id text DEFAULT NULL,
                                   message text DEFAULT NULL) RETURNS text LANGUAGE sql AS $$
  SELECT billguard.record_search_result(pg_temp.t10_key(c), t10_search.attempt, t10_search.outcome,
                                        t10_search.http_status, t10_search.charge_id, 'req_t10' || c,
                                        t10_search.message, r.amount_cents, r.currency, r.stripe_customer)
    FROM pg_temp.t10_r(c) r $$;
-- A search that found `found` ([{id, amount, currency, customer}, ...]).
CREATE FUNCTION pg_temp.t10_found(c text, attempt int, found jsonb) RETURNS text LANGUAGE sql AS $$
  SELECT a.recorded FROM billguard.record_answers(jsonb_build_array(jsonb_build_object(
           'key', pg_temp.t10_key(c), 'attempt', attempt, 'search', true, 'outcome', 'completed',
           'http_status', 200, 'charge_id', found -> 0 ->> 'id', 'request_id', 'req_t10' || c,
           'found', found)), NULL::interval) a $$;
-- The record's amount, currency and customer as a found object's, with `changes`.
CREATE FUNCTION pg_temp.t10_like_record(c text, id text, changes jsonb DEFAULT '{}') RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_build_object('id', id, 'amount', r.amount_cents, 'currency', r.currency,
                            'customer', r.stripe_customer) || changes
    FROM pg_temp.t10_r(c) r $$;
SELECT is(pg_temp.t10_search('sfound', (SELECT 2 FROM pg_temp.t10_dispatching('sfound', 2)), 'completed', 200, 'pi_t10found'),
          'recorded', 'search found: recorded');
SELECT results_eq($$SELECT status, charge_id, completed_at, lease_expires_at, next_attempt_at FROM pg_temp.t10_r('sfound')$$,
                  $$VALUES ('completed', 'pi_t10found', now(), NULL::timestamptz, NULL::timestamptz)$$,
                  'search found: completed with the id found, out of the queue');
SELECT is(pg_temp.t10_last_type('sfound'), 'ChargeReconciled', 'search found: ChargeReconciled');
SELECT is(pg_temp.t10_last('sfound'),
          '{"charge_id": "pi_t10found", "via": "search", "attempt": 2, "request_id": "req_t10sfound"}'::jsonb,
          'ChargeReconciled: charge_id, via search, attempt, Request-Id');

-- The key alone is no proof: another database on this Stripe account, with
-- the same key namespace and customer id, makes the same key.
SELECT is(pg_temp.t10_found('scustomer', (SELECT 2 FROM pg_temp.t10_dispatching('scustomer', 2)),
            jsonb_build_array(pg_temp.t10_like_record('scustomer', 'pi_t10theirs', '{"customer": "cus_elsewhere"}'))),
          'recorded', 'search found the key on another customer''s charge: recorded');
SELECT results_eq($$SELECT status, charge_id, next_attempt_at, lease_expires_at, last_error FROM pg_temp.t10_r('scustomer')$$,
                  $$VALUES ('needs_review', NULL::text, NULL::timestamptz, NULL::timestamptz,
                            'search found pi_t10theirs with the record''s key, but for '
                            || (pg_temp.t10_r('scustomer')).amount_cents || ' usd of customer cus_elsewhere, not the record''s '
                            || (pg_temp.t10_r('scustomer')).amount_cents || ' usd of cus_t10_scustomer: another database '
                            || 'or system bills with this key namespace on this Stripe account')$$,
                  'another customer: needs_review, not completed with their charge, out of the queue, what differed in last_error');
SELECT is(pg_temp.t10_last_type('scustomer') || ' ' || (pg_temp.t10_last('scustomer') ->> 'via') || ' '
            || (pg_temp.t10_last('scustomer') -> 'found' -> 0 ->> 'id'),
          'NeedsReview search pi_t10theirs', 'another customer: NeedsReview via search, naming the object found');
SELECT is(pg_temp.t10_found('samount', (SELECT 2 FROM pg_temp.t10_dispatching('samount', 2)),
            jsonb_build_array(pg_temp.t10_like_record('samount', 'pi_t10amount', '{"amount": 1}')))
          || ' ' || (pg_temp.t10_r('samount')).status,
          'recorded needs_review', 'another amount: needs_review');
SELECT is(pg_temp.t10_found('scurrency', (SELECT 2 FROM pg_temp.t10_dispatching('scurrency', 2)),
            jsonb_build_array(pg_temp.t10_like_record('scurrency', 'pi_t10eur', '{"currency": "eur"}')))
          || ' ' || (pg_temp.t10_r('scurrency')).status,
          'recorded needs_review', 'another currency: needs_review');
SELECT is(pg_temp.t10_search('sunsaid', (SELECT 2 FROM pg_temp.t10_dispatching('sunsaid', 2)), 'completed', 200, 'pi_t10unsaid')
          || ' ' || (pg_temp.t10_r('sunsaid')).status,
          'recorded completed', 'record_search_result passes the found object''s amount, currency and customer');
SELECT is(billguard.record_answers(jsonb_build_array(jsonb_build_object(
            'key', pg_temp.t10_key('sunsaid'), 'attempt', 2, 'search', true, 'outcome', 'completed',
            'http_status', 200, 'charge_id', 'pi_x')), NULL::interval)::text, 'stale',
          '(an answer for a settled record is stale)');
SELECT is(pg_temp.t10_found('ssecond', (SELECT 2 FROM pg_temp.t10_dispatching('ssecond', 2)),
            jsonb_build_array(pg_temp.t10_like_record('ssecond', 'pi_t10first', '{"customer": "cus_elsewhere"}'),
                              pg_temp.t10_like_record('ssecond', 'pi_t10mine'))),
          'recorded', 'search found two objects with the key, the second the record''s: recorded');
SELECT is((pg_temp.t10_r('ssecond')).status || ' ' || (pg_temp.t10_r('ssecond')).charge_id, 'completed pi_t10mine',
          'the one that matches the record is its charge');
UPDATE billguard.billing_records SET status = 'dispatching', attempts = 2, lease_expires_at = now() + interval '1 min'
 WHERE idempotency_key = pg_temp.t10_key('sproc');
SELECT is(billguard.record_answers(jsonb_build_array(jsonb_build_object(
            'key', pg_temp.t10_key('sproc'), 'attempt', 2, 'search', true, 'outcome', 'completed',
            'http_status', 200, 'charge_id', 'pi_t10nothing_said')), NULL::interval)::text
          || ' ' || (pg_temp.t10_r('sproc')).status,
          'recorded needs_review', 'an answer that says nothing of the object found is needs_review');

SELECT is(pg_temp.t10_search('snone', (SELECT 3 FROM pg_temp.t10_dispatching('snone', 3)), 'absent', 200), 'recorded',
          'search found nothing: recorded');
SELECT results_eq($$SELECT status, attempts, lease_expires_at FROM pg_temp.t10_r('snone')$$,
                  $$VALUES ('dispatching', 3, now() + interval '40 seconds')$$,
                  'search found nothing: the record keeps its attempt and lease (the charge is sent next, same key)');
SELECT is(pg_temp.t10_nevents('snone'), 1::bigint, 'search found nothing: no event');

-- Found nothing after the dispatcher's max_unknown_cycles: settled for review.
UPDATE billguard.billing_records SET status = 'unknown', unknown_cycles = 4, next_attempt_at = '1999-01-01'
 WHERE customer_id = 't10_scycles';
SELECT results_eq($$SELECT attempt, action, unknown_cycles
                      FROM billguard.claim_due_records(100, interval '30 seconds', interval '1 day', '/v1/payment_intents')
                     WHERE customer_id = 't10_scycles'$$,
                  $$VALUES (1, 'search', 4)$$, 'claim_due_records returns the record''s unknown cycles');
SELECT is(pg_temp.t10_search('scycles', 1, 'needs_review', 200, NULL,
            'no charge found for the key after 4 indeterminate answers, each followed by a search (max_unknown_cycles): reconcile before retrying'),
          'recorded', 'search found nothing past max_unknown_cycles: recorded');
SELECT results_eq($$SELECT status, next_attempt_at, lease_expires_at, last_error FROM pg_temp.t10_r('scycles')$$,
                  $$VALUES ('needs_review', NULL::timestamptz, NULL::timestamptz,
                            'no charge found for the key after 4 indeterminate answers, each followed by a search (max_unknown_cycles): reconcile before retrying')$$,
                  'past max_unknown_cycles: needs_review, out of the queue, no lease, the reason in last_error');
SELECT is(pg_temp.t10_last_type('scycles'), 'NeedsReview', 'past max_unknown_cycles: NeedsReview');
SELECT is(pg_temp.t10_last('scycles'),
          '{"http_status": 200, "message": "no charge found for the key after 4 indeterminate answers, each followed by a search (max_unknown_cycles): reconcile before retrying", "request_id": "req_t10scycles", "attempt": 1, "via": "search"}'::jsonb,
          'NeedsReview: the reason, the search''s Request-Id, the attempt, via search');
SELECT is(billguard.retry_record('t10_scycles', '2031-10') || ' ' || coalesce((pg_temp.t10_r('scycles')).unknown_cycles::text, 'none'),
          'pending none', 'retry_record counts unknown cycles from none again');

SELECT is(pg_temp.t10_search('serr', (SELECT 2 FROM pg_temp.t10_dispatching('serr', 2)), 'retry', 500, NULL,
            'search failed with HTTP 500'), 'recorded', 'search told nothing: recorded');
SELECT results_eq($$SELECT status, next_attempt_at > now(), lease_expires_at, last_error FROM pg_temp.t10_r('serr')$$,
                  $$VALUES ('unknown', true, NULL::timestamptz, 'search failed with HTTP 500')$$,
                  'search told nothing: unknown, backoff, last_error');
SELECT is(pg_temp.t10_search('s401', (SELECT 2 FROM pg_temp.t10_dispatching('s401', 2)), 'paused', 401), 'recorded',
          'search refused (401): recorded');
SELECT results_eq($$SELECT status, attempts, next_attempt_at FROM pg_temp.t10_r('s401')$$,
                  $$VALUES ('unknown', 1, now())$$, 'search refused: unknown again, due now, the attempt not counted');
SELECT is(pg_temp.t10_search('shtml', (SELECT 2 FROM pg_temp.t10_dispatching('shtml', 2)), 'not_sent', 0), 'recorded',
          'search never sent: recorded');
SELECT results_eq($$SELECT status, attempts, next_attempt_at FROM pg_temp.t10_r('shtml')$$,
                  $$VALUES ('unknown', 1, now())$$,
                  'search never sent: unknown again, the attempt not counted');

------------------------------------------------------------------------------
-- release_claim(key, attempt, search): a claim the dispatcher never sent
-- (it paused first) goes back to the queue, the attempt not counted.
SELECT is(billguard.release_claim(pg_temp.t10_dispatching('rel_charge', 2), 2, false), 'released',
          'release_claim of an unsent charge: released');
SELECT results_eq($$SELECT status, attempts, next_attempt_at, lease_expires_at FROM pg_temp.t10_r('rel_charge')$$,
                  $$VALUES ('pending', 1, now(), NULL::timestamptz)$$,
                  'release_claim: pending, due now, the attempt not counted, no lease');
SELECT is(billguard.release_claim(pg_temp.t10_dispatching('rel_search', 3), 3, true), 'released',
          'release_claim of an unsent search: released');
SELECT results_eq($$SELECT status, attempts, next_attempt_at FROM pg_temp.t10_r('rel_search')$$,
                  $$VALUES ('unknown', 2, now())$$, 'release_claim of a search: unknown again (searched first next time)');
SELECT is(billguard.release_claim(pg_temp.t10_dispatching('rel_stale', 2), 1, false), 'stale',
          'release_claim of an older attempt: stale');
SELECT results_eq($$SELECT status, attempts FROM pg_temp.t10_r('rel_stale')$$, $$VALUES ('dispatching', 2)$$,
                  'release_claim of an older attempt changes nothing');
SELECT is(pg_temp.t10_nevents('rel_charge') + pg_temp.t10_nevents('rel_search') + pg_temp.t10_nevents('rel_stale'), 3::bigint,
          'release_claim writes no event');

------------------------------------------------------------------------------
-- retry_record(customer, period)
DO $$ BEGIN PERFORM pg_temp.t10_set(c, s) FROM (VALUES ('rt_failed', 'failed'), ('rt_review', 'needs_review'), ('rt_completed', 'completed'),
                                          ('rt_unknown', 'unknown'), ('rt_dispatching', 'dispatching'), ('rt_blocked', 'blocked'),
                                          ('rs_review', 'needs_review'), ('rs_failed', 'failed'), ('rs_unknown', 'unknown'),
                                          ('rs_completed', 'completed'), ('rs_dispatching', 'dispatching'), ('rs_blocked', 'blocked')) v(c, s); END $$;
UPDATE billguard.billing_records SET attempts = 7, first_dispatched_at = now() - interval '3 days'
 WHERE customer_id IN ('t10_rt_failed', 't10_rt_review');

SELECT is(billguard.retry_record('t10_rt_failed', '2031-10'), 'pending', 'retry_record of a failed record: pending');
SELECT results_eq($$SELECT status, attempts, next_attempt_at, first_dispatched_at FROM pg_temp.t10_r('rt_failed')$$,
                  $$VALUES ('pending', 0, now(), now() - interval '3 days')$$,
                  'retry_record: pending, attempts 0, due now, first_dispatched_at kept (so an old one is searched first)');
SELECT is(pg_temp.t10_last_type('rt_failed'), 'RecordRequeued', 'retry_record: RecordRequeued event');
SELECT is(pg_temp.t10_last('rt_failed') - 'by', '{"previous_status": "failed", "last_error": "earlier error"}'::jsonb,
          'RecordRequeued: previous status and last error');
SELECT is(pg_temp.t10_last('rt_failed') ->> 'by', session_user::text, 'RecordRequeued: by session_user');
SELECT is(billguard.retry_record('t10_rt_review', '2031-10'), 'pending', 'retry_record of a needs_review record: pending');
SELECT is((pg_temp.t10_r('rt_review')).status, 'pending', 'retry_record of needs_review: pending');
SELECT results_eq($$SELECT customer_id, attempt, action FROM billguard.claim_due_records(100, interval '30 seconds', interval '1 day', '/v1/payment_intents')
                    WHERE customer_id LIKE 't10\_rt\_%' ORDER BY customer_id$$,
                  $$VALUES ('t10_rt_failed', 1, 'search'), ('t10_rt_review', 1, 'search')$$,
                  'requeued records first dispatched 3 days ago are searched for first');
SELECT throws_ok($$SELECT billguard.retry_record('t10_rt_pending', '2031-10')$$, '22023', NULL,
                 'retry_record of a pending record: 22023');
SELECT throws_ok($$SELECT billguard.retry_record('t10_rt_completed', '2031-10')$$, '22023',
                 'billing record t10_rt_completed/2031-10 is completed, only failed or needs_review records can be retried',
                 'retry_record of a completed record: 22023 with the status in the message');
SELECT throws_ok($$SELECT billguard.retry_record('t10_rt_unknown', '2031-10')$$, '22023', NULL,
                 'retry_record of an unknown record: 22023');
SELECT throws_ok($$SELECT billguard.retry_record('t10_rt_dispatching', '2031-10')$$, '22023', NULL,
                 'retry_record of a dispatching record: 22023');
SELECT throws_ok($$SELECT billguard.retry_record('t10_rt_blocked', '2031-10')$$, '22023', NULL,
                 'retry_record of a blocked record: 22023');
SELECT throws_ok($$SELECT billguard.retry_record('t10_nobody', '2031-10')$$, 'P0002', NULL,
                 'retry_record without a record: P0002');
SELECT throws_ok($$SELECT billguard.retry_record('t10_rt_failed', '2031-13')$$, '22023', NULL,
                 'retry_record with a bad period: 22023');
SELECT results_eq($$SELECT customer_id, status, pg_temp.t10_nevents(substr(customer_id, 5)) FROM billguard.billing_records
                     WHERE customer_id IN ('t10_rt_pending', 't10_rt_completed', 't10_rt_unknown', 't10_rt_dispatching', 't10_rt_blocked')
                     ORDER BY customer_id$$,
                  $$VALUES ('t10_rt_blocked', 'blocked', 1::bigint), ('t10_rt_completed', 'completed', 1::bigint),
                           ('t10_rt_dispatching', 'dispatching', 1::bigint), ('t10_rt_pending', 'pending', 1::bigint),
                           ('t10_rt_unknown', 'unknown', 1::bigint)$$,
                  'refused retry_record calls change nothing and write no event');

------------------------------------------------------------------------------
-- resolve_record(customer, period, charge_id)
SELECT is(billguard.resolve_record('t10_rs_review', '2031-10', 'pi_t10Resolved1'), 'completed',
          'resolve_record of a needs_review record: completed');
SELECT results_eq($$SELECT status, charge_id, completed_at FROM pg_temp.t10_r('rs_review')$$,
                  $$VALUES ('completed', 'pi_t10Resolved1', now())$$, 'resolve_record: completed with the given id');
SELECT is(pg_temp.t10_last_type('rs_review'), 'ReviewResolved', 'resolve_record: ReviewResolved event');
SELECT is(pg_temp.t10_last('rs_review') - 'by', '{"charge_id": "pi_t10Resolved1", "previous_status": "needs_review"}'::jsonb,
          'ReviewResolved: charge_id and previous status');
SELECT is(billguard.resolve_record('t10_rs_failed', '2031-10', 'ch_t10Resolved2'), 'completed',
          'resolve_record of a failed record with a ch_ id: completed');
SELECT is(billguard.resolve_record('t10_rs_unknown', '2031-10', 'pi_t10Resolved3'), 'completed',
          'resolve_record of an unknown record: completed');
SELECT results_eq($$SELECT status, charge_id FROM pg_temp.t10_r('rs_unknown')$$, $$VALUES ('completed', 'pi_t10Resolved3')$$,
                  'resolve_record of unknown: completed with the id');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t10_rs_failed', '2031-10')$$,
                  $$SELECT 'already_completed'::text, pg_temp.t10_key('rs_failed'), 'ch_t10Resolved2'::text$$,
                  'after resolve_record, bill_customer answers already_completed with the resolved id');
SELECT throws_ok($$SELECT billguard.resolve_record('t10_rs_pending', '2031-10', 'pi_t10x')$$, '22023', NULL,
                 'resolve_record of a pending record: 22023');
SELECT throws_ok($$SELECT billguard.resolve_record('t10_rs_completed', '2031-10', 'pi_t10x')$$, '22023',
                 'billing record t10_rs_completed/2031-10 is completed, only needs_review, failed or unknown records can be resolved',
                 'resolve_record of a completed record: 22023');
SELECT throws_ok($$SELECT billguard.resolve_record('t10_rs_dispatching', '2031-10', 'pi_t10x')$$, '22023', NULL,
                 'resolve_record of a dispatching record: 22023');
SELECT throws_ok($$SELECT billguard.resolve_record('t10_rs_blocked', '2031-10', 'pi_t10x')$$, '22023', NULL,
                 'resolve_record of a blocked record: 22023');
SELECT throws_ok($$SELECT billguard.resolve_record('t10_rs_review', '2031-10', 'pi_again')$$, '22023', NULL,
                 'resolve_record of a record it already resolved: 22023');
SELECT throws_ok($$SELECT billguard.resolve_record('t10_nobody', '2031-10', 'pi_t10x')$$, 'P0002', NULL,
                 'resolve_record without a record: P0002');
SELECT throws_ok($$SELECT billguard.resolve_record('t10_rs_dispatching', '2031-10', 'xx_123')$$, '22023',
                 'charge_id must be a Stripe id (pi_... or ch_...)', 'resolve_record with a non-Stripe id: 22023');
SELECT throws_ok($$SELECT billguard.resolve_record('t10_rs_dispatching', '2031-10', NULL)$$, '22023', NULL,
                 'resolve_record with a NULL id: 22023');
SELECT throws_ok($$SELECT billguard.resolve_record('t10_rs_dispatching', '2031-10', 'pi_x; DROP')$$, '22023', NULL,
                 'resolve_record with junk after the id: 22023');
SELECT throws_ok($$SELECT billguard.resolve_record('t10_rs_review', 'August', 'pi_t10x')$$, '22023', NULL,
                 'resolve_record with a bad period: 22023');
SELECT results_eq($$SELECT customer_id, status, charge_id, pg_temp.t10_nevents(substr(customer_id, 5)) FROM billguard.billing_records
                     WHERE customer_id IN ('t10_rs_pending', 't10_rs_completed', 't10_rs_dispatching', 't10_rs_blocked', 't10_rs_review')
                     ORDER BY customer_id$$,
                  $$VALUES ('t10_rs_blocked', 'blocked', NULL::text, 1::bigint),
                           ('t10_rs_completed', 'completed', 'pi_t10rs_completed', 1::bigint),
                           ('t10_rs_dispatching', 'dispatching', NULL::text, 1::bigint),
                           ('t10_rs_pending', 'pending', NULL::text, 1::bigint),
                           ('t10_rs_review', 'completed', 'pi_t10Resolved1', 2::bigint)$$,
                  'refused resolve_record calls change nothing and write no event');

SELECT * FROM finish();
ROLLBACK;

-- The row committed for the SKIP LOCKED check.
BEGIN;
ALTER TABLE billguard.billing_records DISABLE TRIGGER billing_records_keep_rows;
DELETE FROM billguard.billing_records WHERE customer_id = 't10_skiplocked';
ALTER TABLE billguard.billing_records ENABLE ALWAYS TRIGGER billing_records_keep_rows;
COMMIT;
