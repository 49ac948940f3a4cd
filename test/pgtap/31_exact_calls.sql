-- 31_exact_calls.sql: every call billguard's SQL makes of its own functions
-- passes the exact argument types of its target, so no overload added to
-- schema billguard can match better and run in its place (as whoever called
-- billguard: the dispatcher runs as a superuser).
--
-- Proves, with test/lib/overload_traps.sql planted (an overload beside every
-- function for each argument type an implicit cast could come from; called
-- from a function of billguard it raises): billing a period and a customer,
-- claiming, recording every kind of answer to a charge and to a search
-- (retry_delay's cap among them), releasing a claim, requeueing, resolving,
-- cancelling, deactivating an account, the journal's appends, folds,
-- snapshots and retention, the scheduler's tick and views, await_billing,
-- a webhook event applied, the vault ledger (issue, authorize, settle,
-- raise, revoke, status, the dispatcher's key request and its credentials)
-- and archive_history all run into no trap.
BEGIN;
SELECT plan(22);

\ir ../lib/overload_traps.sql

SELECT cmp_ok((SELECT count(*) FROM pg_proc WHERE prosrc LIKE '%billguard overload trap%'), '>', 200::bigint,
              'the traps are planted');
-- A function of billguard's that passes an integer for retry_delay's cap.
CREATE FUNCTION billguard.t31_inexact_caller() RETURNS interval LANGUAGE plpgsql
  AS $$BEGIN RETURN billguard.retry_delay(1, 900); END$$;
SELECT throws_like($$SELECT billguard.t31_inexact_caller()$$,
                   'billguard overload trap: billguard.retry_delay(integer, integer) called by PL/pgSQL function billguard.t31_inexact_caller()%',
                   'a call of billguard''s whose argument needs a cast runs into its trap');
SELECT isnt(billguard.retry_delay(1, 900), NULL, 'a test''s own call is handed on to the function it shadows');

INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, payment_method)
SELECT 't31_' || g, 'cus_t31' || g, 1000 + g, 'pm_card_visa' FROM generate_series(1, 12) g;
CREATE FUNCTION pg_temp.key_of(n integer) RETURNS text LANGUAGE sql AS
  $$SELECT billguard.idempotency_key('t31_' || n, '2042-01')$$;

SELECT lives_ok($$SELECT * FROM billguard.bill_period('2042-01')$$, 'bill_period');
SELECT lives_ok($$SELECT * FROM billguard.bill_customer('t31_1', '2042-02', 'req_t31')$$, 'bill_customer');
SELECT lives_ok($$SELECT * FROM billguard.claim_due_records(50, '10 min', '23 h', '/v1/payment_intents')$$,
                'claim_due_records');
SELECT lives_ok($$
  SELECT billguard.record_charge_response(pg_temp.key_of(n), 1, o, s, c, false, 'req_t31', t, NULL, NULL, 'm',
                                          NULL, '2 min')
    FROM (VALUES (1, 'completed', 200, 'pi_t31_1', NULL), (2, 'failed', 402, NULL, 'card_error'),
                 (3, 'retry', 503, NULL, 'api_error'), (4, 'throttled', 429, NULL, 'rate_limit_error'),
                 (5, 'unknown', 500, NULL, 'api_error'), (6, 'needs_review', 400, NULL, 'idempotency_error'),
                 (7, 'blocked', 429, NULL, 'invalid_request_error'), (8, 'paused', 401, NULL, 'invalid_request_error'),
                 (9, 'not_sent', 0, NULL, 'network')) AS a (n, o, s, c, t)$$,
                'record_charge_response, every outcome (retry and throttled call retry_delay)');
SELECT lives_ok($$SELECT billguard.release_claim(pg_temp.key_of(10), 1, false)$$, 'release_claim');
UPDATE billguard.billing_records SET status = 'unknown', next_attempt_at = now() - interval '1 s'
 WHERE idempotency_key IN (pg_temp.key_of(11), pg_temp.key_of(12));
SELECT lives_ok($$SELECT count(*) FROM billguard.claim_due_records(50, '10 min', '23 h', '/v1/payment_intents')$$,
                'claim_due_records of unknown records (searches)');
SELECT lives_ok($$
  SELECT billguard.record_search_result(pg_temp.key_of(n), attempts, o, 200, c, 'req_t31', 'm')
    FROM (VALUES (11, 'retry', NULL), (12, 'absent', NULL)) AS a (n, o, c)
    JOIN billguard.billing_records r ON r.idempotency_key = pg_temp.key_of(a.n)$$,
                'record_search_result (a search that told nothing calls retry_delay)');
SELECT lives_ok($$SELECT billguard.requeue_abandoned()$$, 'requeue_abandoned');
DO $$BEGIN PERFORM billguard.bill_customer('t31_3', '2042-03'); END$$;
SELECT lives_ok($$
  SELECT billguard.retry_record('t31_2', '2042-01'), billguard.retry_period('2042-01', 'needs_review'),
         billguard.resolve_record('t31_5', '2042-01', 'pi_t31_5'), billguard.cancel_record('t31_3', '2042-03')$$,
                'retry_record, retry_period, resolve_record, cancel_record');
SELECT lives_ok($$UPDATE billguard.accounts SET active = false WHERE customer_id = 't31_10'$$,
                'deactivating an account (cancel_unsent_of_deactivated)');
SELECT lives_ok($$
  SELECT billguard.append_event('t31-entity', 0::bigint, 'Noted', '{}'::jsonb),
         billguard.save_snapshot('t31-entity'),
         (SELECT count(*) FROM billguard.apply_retention('t31-entity', 1)),
         (SELECT count(*) FROM billguard.events('t31-entity', 1::bigint, NULL::bigint, 10::bigint)),
         billguard.entity_state('billing-t31_3-2042-01')$$,
                'append_event, save_snapshot, apply_retention, events, entity_state');
SELECT lives_ok($$
  SELECT (SELECT count(*) FROM billguard.period_status('2042-01')),
         (SELECT count(*) FROM billguard.due_periods()),
         (SELECT count(*) FROM billguard.scheduler_status),
         (SELECT count(*) FROM billguard.dispatch_status)$$,
                'period_status, due_periods, scheduler_status, dispatch_status');
SELECT lives_ok($$SELECT * FROM billguard.scheduler_tick()$$, 'scheduler_tick');
SELECT lives_ok($$SELECT * FROM billguard.await_billing('t31_5', '2042-01', '0 s')$$, 'await_billing');
SELECT lives_ok($$
  SELECT billguard.apply_stripe_event(r, jsonb_build_object(
           'id', 'evt_t31', 'type', 'payment_intent.succeeded', 'created', 1700000000,
           'data', jsonb_build_object('object', jsonb_build_object(
             'object', 'payment_intent', 'id', 'pi_t31_6', 'amount', r.amount_cents, 'currency', r.currency,
             'customer', r.stripe_customer, 'created', 1700000000,
             'metadata', jsonb_build_object('billguard_key', r.idempotency_key)))))
    FROM billguard.billing_records r WHERE r.idempotency_key = pg_temp.key_of(6)$$,
                'apply_stripe_event');
CREATE TEMP TABLE t31_key AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2042-01', 100::numeric, ARRAY['/v1/payment_intents'],
                                          now() + interval '40 days', false, NULL::numeric);
SELECT lives_ok($$
  SELECT (SELECT decision FROM billguard.vault_authorize(sha256(convert_to((SELECT vault_key FROM t31_key), 'UTF8')),
                                                       'POST', '/v1/payment_intents', 'idem_t31', repeat('a', 64),
                                                       1000::bigint, 'usd', 'cus_t31'))$$,
                'vault_authorize');
SELECT lives_ok($$
  SELECT billguard.vault_settle((SELECT key_id FROM t31_key), 'idem_t31', 200, NULL, 'pi_t31v', '{}', 'req_t31', 1),
         billguard.raise_vault_cap((SELECT key_id FROM t31_key), 200::numeric),
         (SELECT count(*) FROM billguard.vault_key_status((SELECT key_id FROM t31_key))),
         billguard.revoke_vault_key((SELECT key_id FROM t31_key))$$,
                'vault_settle, raise_vault_cap, vault_key_status, revoke_vault_key');
SELECT lives_ok($$
  SELECT (SELECT body FROM billguard.vault_key_request('2042-01', '/v1/payment_intents', 1.1::numeric, NULL::bigint)),
         billguard.store_vault_credential('http://127.0.0.1:1', '2042-01', 'usd', 'vkey_t31aaaaaaaaaaaaa', 'vk_test_' || repeat('a', 32), 1000::bigint),
         billguard.forget_vault_credential('http://127.0.0.1:1', '2042-01', 'usd', 'vkey_t31aaaaaaaaaaaaa')$$,
                'vault_key_request, store_vault_credential, forget_vault_credential');
UPDATE billguard.billing_records SET status = 'cancelled', next_attempt_at = NULL
 WHERE status IN ('pending', 'dispatching', 'unknown');
SELECT lives_ok($$SELECT count(*) FROM billguard.archive_history('t31_archive')$$, 'archive_history');

SELECT * FROM finish();
ROLLBACK;
