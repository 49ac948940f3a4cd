-- 21_vault_decisions.sql: vault_authorize and vault_settle, the proxy's
-- decisions.
--
-- Proves: unknown, revoked and expired keys are 401; another endpoint or
-- method and another currency are 403; reads are forwarded uncounted; a
-- charge without Idempotency-Key or currency is 400; a charge is reserved
-- up to exactly the cap and the next cent is 429, spend_cap_pending (a
-- throttle) while reservations of the budget are open and would leave room
-- if released, spend_cap_exceeded ("spend cap exceeded for billing_period
-- <period>") once what settled leaves none; the same key reuses its
-- reservation (counted once, each attempt numbered), through another key
-- of the budget too, and with other parameters is idempotency_error; a
-- settled success is replayed with its status, body and Request-Id; 402 and
-- invalid_request_error release, 409 and 429 (never executed) release, but
-- only when no other attempt of the key is in doubt: after a 500 or no
-- answer the amount stays reserved through a later refusal, and a later
-- success settles it once; answering an attempt twice changes nothing; a
-- released key is reserved again on retry; a key still reserved past the
-- idempotency window is handed to reconciliation, never reused, and
-- vault_reconcile settles it (found), releases it (absent), leaves it
-- (uncertain) or ignores a finding older than a newer attempt (stale);
-- vault_reservations_in_doubt lists what the reconciler looks up; bad
-- arguments are 22023 and change nothing; every decision is one audit row.
BEGIN;
SELECT plan(76);

CREATE TEMP TABLE k AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2041-01', 50, ARRAY['/v1/payment_intents'],
                                          now() + interval '40 days', false);
CREATE TEMP TABLE k2 AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2041-01', 50, ARRAY['/v1/payment_intents'],
                                          now() + interval '40 days', false);
-- authorize(vault key, method, path, idempotency key, digest letter, amount, currency)
CREATE FUNCTION pg_temp.authorize(secret text, method text, path text, idem text, digest text,
                                  amount bigint, currency text DEFAULT 'usd',
                                  idempotency_window interval DEFAULT '23 hours')
  RETURNS TABLE (decision text, http_status integer, body text, key_id text, request_id text,
                 attempt integer, should_retry boolean)
  LANGUAGE sql AS $$
  SELECT * FROM billguard.vault_authorize(sha256(convert_to(secret, 'UTF8')), method, path, idem,
                                          repeat(digest, 64), amount, currency, 'cus_t21',
                                          'key-' || idem, idempotency_window)
$$;
-- settle(key id, idempotency key, attempt, upstream status, error type)
CREATE FUNCTION pg_temp.settle(key_id text, idem text, attempt integer, upstream integer,
                               error_type text DEFAULT NULL) RETURNS text
  LANGUAGE sql AS $$
  SELECT billguard.vault_settle(key_id, idem, upstream, error_type,
                                CASE WHEN upstream = 200 THEN 'pi_' || idem END,
                                CASE WHEN upstream = 200 THEN '{"id": "pi_' || idem || '"}' ELSE '{}' END,
                                'req_' || idem || '_' || attempt, attempt)
$$;
CREATE FUNCTION pg_temp.decision(secret text, method text, path text, idem text, digest text,
                                 amount bigint, currency text DEFAULT 'usd') RETURNS text
  LANGUAGE sql AS $$
  SELECT a.decision || coalesce(' ' || a.http_status, '') || coalesce(' ' || (a.body::jsonb -> 'error' ->> 'code'), '')
    FROM pg_temp.authorize(secret, method, path, idem, digest, amount, currency) a
$$;
CREATE FUNCTION pg_temp.sums() RETURNS text LANGUAGE sql AS $$
  SELECT settled_cents || '/' || reserved_cents FROM billguard.vault_spend WHERE billing_period = '2041-01'
$$;
CREATE TEMP TABLE other AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2041-02', 50, ARRAY['/v1/payment_intents'],
                                          now() + interval '40 days', false);
UPDATE billguard.vault_keys SET expires_at = now() WHERE key_id = (SELECT key_id FROM other);

-- Scope.
SELECT is(pg_temp.decision('vk_test_' || repeat('x', 32), 'POST', '/v1/payment_intents', 'i0', 'a', 50),
          'refused 401 vault_key_unknown', 'an unknown key is 401');
SELECT is(pg_temp.decision((SELECT vault_key FROM other), 'POST', '/v1/payment_intents', 'i0', 'a', 50),
          'refused 401 vault_key_expired', 'an expired key is 401');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/charges', 'i0', 'a', 50),
          'refused 403 endpoint_not_allowed', 'an endpoint the key does not allow is 403');
SELECT is((SELECT body::jsonb -> 'error' ->> 'message'
             FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/charges', 'i0', 'a', 50)),
          format('vault key %s may call GET and POST on /v1/payment_intents only, not POST /v1/charges', (SELECT key_id FROM k)),
          '... and the refusal names the allowed endpoints');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'DELETE', '/v1/payment_intents/pi_1', NULL, 'a', NULL),
          'refused 403 endpoint_not_allowed', 'a method other than GET and POST is 403');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents_evil', 'i0', 'a', 50),
          'refused 403 endpoint_not_allowed', 'a path that merely begins like an allowed one is 403');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i0', 'a', 50, 'eur'),
          'refused 403 currency_not_allowed', 'another currency is 403');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'GET', '/v1/payment_intents/search', NULL, 'a', NULL),
          'forwarded', 'a read of an allowed endpoint is forwarded, uncounted');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', NULL, 'a', 50),
          'refused 400 idempotency_key_required', 'a charge without Idempotency-Key is 400');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i0', 'a', 50, NULL),
          'refused 400 parameter_missing', 'a charge without currency is 400');
SELECT is(pg_temp.sums(), '0/0', 'no refusal and no read counted anything');

-- Reservations up to the cap (5,000 cents).
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i1', 'a', 3000),
          'reserved', 'a charge within the cap is reserved');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i1', 'a', 3000),
          'reused', 'the same Idempotency-Key reuses its reservation');
SELECT is(pg_temp.decision((SELECT vault_key FROM k2), 'POST', '/v1/payment_intents', 'i1', 'a', 3000),
          'reused', '... also through another key of the same budget');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i1', 'b', 3000),
          'refused 400', 'the same Idempotency-Key with other parameters is refused');
SELECT is((SELECT body::jsonb -> 'error' ->> 'type'
             FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i1', 'b', 3000)),
          'idempotency_error', '... as Stripe''s idempotency_error');
SELECT is(pg_temp.sums(), '0/3000', 'the reservation is counted once');
SELECT results_eq($$SELECT decision, http_status, body::jsonb -> 'error' ->> 'code', should_retry
                      FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i2', 'a', 2001)$$,
                  $$VALUES ('refused'::text, 429, 'spend_cap_pending'::text, true)$$,
                  'a charge one cent past the cap while i1 is still open is 429 spend_cap_pending, a throttle');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i2', 'a', 2000),
          'reserved', 'a charge reaching exactly the cap is reserved');
SELECT is(pg_temp.sums(), '0/5000', 'settled + reserved = the cap, never more');
SELECT is((SELECT attempts || ' ' || attempts_in_doubt::text FROM billguard.vault_reservations WHERE idempotency_key = 'i1'),
          '3 {1,2,3}', 'each forwarded attempt of i1 is numbered, and in doubt until answered');

-- Settling.
SELECT is(pg_temp.settle((SELECT key_id FROM k), 'i1', 1, 200), 'settled', 'a 200 settles the reservation');
SELECT is(pg_temp.settle((SELECT key_id FROM k2), 'i1', 2, 200),
          'settled', 'a second 200 for the same Idempotency-Key (a concurrent retry) ...');
SELECT is(pg_temp.sums(), '3000/2000', '... is counted once');
SELECT results_eq($$SELECT decision, http_status, body, request_id
                      FROM pg_temp.authorize((SELECT vault_key FROM k2), 'POST', '/v1/payment_intents', 'i1', 'a', 3000)$$,
                  $$VALUES ('replayed'::text, 200, '{"id": "pi_i1"}'::text, 'req_i1_1'::text)$$,
                  'a settled success is replayed with its status, body and Request-Id, through any key of the budget');
SELECT results_eq($$SELECT decision, http_status, body::jsonb -> 'error' ->> 'code', should_retry
                      FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i9', 'a', 2000)$$,
                  $$VALUES ('refused'::text, 429, 'spend_cap_pending'::text, true)$$,
                  'i2 open: 2,000 cents would fit once it is released: spend_cap_pending');
SELECT is((SELECT body FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i9', 'a', 2000)),
          '{"error": {"code": "spend_cap_pending", "type": "invalid_request_error", "message": "the spend cap of billing_period 2041-01 is held by charges in flight or of unknown outcome; retry later with the same Idempotency-Key"}}',
          '... with a Stripe-shaped body that says why');

-- An unknown outcome keeps the amount through a later refusal.
SELECT is(pg_temp.settle((SELECT key_id FROM k), 'i2', 1, 500, 'api_error'), 'unknown', 'a 500 leaves the outcome unknown');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i2', 'a', 2000),
          'reused', 'the key comes again (attempt 2)');
SELECT is(pg_temp.settle((SELECT key_id FROM k), 'i2', 2, 402, 'card_error'), 'unknown',
          'a 402 to attempt 2 does not release: attempt 1 may have charged');
SELECT is((SELECT reason FROM billguard.vault_audit WHERE idempotency_key = 'i2' ORDER BY occurred_at DESC LIMIT 1),
          '402 card_error to attempt 2, but attempt 1 of the key may have charged: kept reserved until reconciled',
          '... and the audit trail says why');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i2', 'a', 2000),
          'reused', 'attempt 3');
SELECT is(pg_temp.settle((SELECT key_id FROM k), 'i2', 3, 0), 'unknown', 'no answer leaves the outcome unknown');
SELECT is(pg_temp.settle((SELECT key_id FROM k), 'i2', 3, 429, 'rate_limit_error'), 'unknown',
          'a 429 to attempt 3 does not release: attempt 1 is in doubt');
SELECT is(pg_temp.sums(), '3000/2000', '... and the amount stays reserved');
SELECT is((SELECT attempts_in_doubt::text FROM billguard.vault_reservations WHERE idempotency_key = 'i2'),
          '{1}', 'attempt 1 is still in doubt');
SELECT results_eq($$SELECT decision, http_status, body::jsonb -> 'error' ->> 'code', should_retry
                      FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i9', 'a', 2000)$$,
                  $$VALUES ('refused'::text, 429, 'spend_cap_pending'::text, true)$$,
                  'while i2 is in doubt, a charge it would make room for is still a throttle');
SELECT is(pg_temp.settle((SELECT key_id FROM k), 'i2', 1, 402, 'card_error'), 'released',
          'attempt 1 answered 402 at last: no attempt can have charged, released');
SELECT is(pg_temp.settle((SELECT key_id FROM k), 'i2', 1, 402, 'card_error'), 'released',
          'the same answer again changes nothing');
SELECT is(pg_temp.sums(), '3000/0', '... and the amount is no longer counted');
SELECT throws_ok($$SELECT pg_temp.settle((SELECT key_id FROM k), 'i2', 4, 200)$$, '22023', NULL,
                 'an attempt never made is 22023');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i2', 'a', 2000),
          'reserved', 'a retry of a released key is reserved again');
SELECT is(pg_temp.settle((SELECT key_id FROM k), 'i2', 4, 400, 'invalid_request_error'),
          'released', 'a 400 invalid_request_error releases it');
SELECT is(pg_temp.sums(), '3000/0', 'released, nothing reserved');
SELECT is(pg_temp.settle((SELECT key_id FROM k), 'i2', 2, 200), 'settled', 'a success Stripe answers after it refused the key ...');
SELECT is(pg_temp.sums(), '5000/0', '... is counted again: the money is spent');
SELECT is((SELECT committed_cents FROM billguard.vault_budgets WHERE billing_period = '2041-01'), 5000::bigint,
          'the budget''s committed sum is its settled and reserved sums');
SELECT results_eq($$SELECT decision, http_status, body::jsonb -> 'error' ->> 'code', should_retry
                      FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i9', 'a', 1)$$,
                  $$VALUES ('refused'::text, 429, 'spend_cap_exceeded'::text, false)$$,
                  'nothing open and the cap full: spend_cap_exceeded, final');
SELECT is((SELECT body FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i9', 'a', 1)),
          '{"error": {"code": "spend_cap_exceeded", "type": "invalid_request_error", "message": "spend cap exceeded for billing_period 2041-01"}}',
          '... with a Stripe-shaped body: spend cap exceeded for billing_period 2041-01');

-- 409 and 429 never executed: released once nothing else is in doubt.
CREATE TEMP TABLE k3 AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2041-03', 50, ARRAY['/v1/payment_intents'],
                                          now() + interval '40 days', false);
SELECT is(pg_temp.decision((SELECT vault_key FROM k3), 'POST', '/v1/payment_intents', 'j1', 'a', 1000), 'reserved',
          'j1 reserved');
SELECT is(pg_temp.settle((SELECT key_id FROM k3), 'j1', 1, 429, 'rate_limit_error'), 'released',
          'a 429 to its only attempt releases it (Stripe rate-limits before executing)');
SELECT is(pg_temp.decision((SELECT vault_key FROM k3), 'POST', '/v1/payment_intents', 'j1', 'a', 1000), 'reserved',
          'j1 again (attempt 2)');
SELECT is(pg_temp.decision((SELECT vault_key FROM k3), 'POST', '/v1/payment_intents', 'j1', 'a', 1000), 'reused',
          'and at once again (attempt 3)');
SELECT is(pg_temp.settle((SELECT key_id FROM k3), 'j1', 3, 409, 'idempotency_error'), 'unknown',
          'a 409 to attempt 3: attempt 2 is still running, kept');
SELECT is(pg_temp.settle((SELECT key_id FROM k3), 'j1', 2, 200), 'settled', 'attempt 2 succeeds: settled');

-- Past the idempotency window: handed to reconciliation, never reused.
SELECT is(pg_temp.decision((SELECT vault_key FROM k3), 'POST', '/v1/payment_intents', 'j2', 'a', 1000), 'reserved',
          'j2 reserved');
SELECT is(pg_temp.settle((SELECT key_id FROM k3), 'j2', 1, 0), 'unknown', 'j2 got no answer');
UPDATE billguard.vault_reservations SET reserved_at = now() - interval '2 hours', last_forwarded_at = now() - interval '2 hours'
 WHERE idempotency_key IN ('j2', 'j3');
CREATE TEMP TABLE j2 AS
  SELECT * FROM pg_temp.authorize((SELECT vault_key FROM k3), 'POST', '/v1/payment_intents', 'j2', 'a', 1000, 'usd', '1 hour');
SELECT is((SELECT decision || ' ' || (http_status IS NULL) || ' ' || (attempt IS NULL) FROM j2), 'reconcile true true',
          'past a window of 1 hour, j2 is to be reconciled, and no attempt is counted');
SELECT is((SELECT body::jsonb - 'reserved_at' - 'last_forwarded_at' FROM j2),
          format('{"key_id": "%s", "customer": "cus_t21", "attempts": 1, "endpoint": "/v1/payment_intents", "search_key": "key-j2", "attempts_in_doubt": [1]}',
                 (SELECT key_id FROM k3))::jsonb,
          '... with what the ledger knows of it');
SELECT is((SELECT attempts FROM billguard.vault_reservations WHERE idempotency_key = 'j2'), 1, '... and nothing forwarded');
SELECT is(pg_temp.decision((SELECT vault_key FROM k3), 'POST', '/v1/payment_intents', 'j2', 'a', 1000), 'reused',
          'within the default window of 23 hours it is reused');
SELECT is((SELECT string_agg(idempotency_key || ':' || attempts, ' ' ORDER BY idempotency_key)
             FROM billguard.vault_reservations_in_doubt('1 hour', 10) WHERE key_id = (SELECT key_id FROM k3)),
          NULL, 'an attempt forwarded just now is not listed for the reconciler');
UPDATE billguard.vault_reservations SET last_forwarded_at = now() - interval '2 hours' WHERE idempotency_key = 'j2';
SELECT is((SELECT string_agg(idempotency_key || ':' || attempts, ' ' ORDER BY idempotency_key)
             FROM billguard.vault_reservations_in_doubt('1 hour', 10) WHERE key_id = (SELECT key_id FROM k3)),
          'j2:2', 'quiet for 2 hours, it is listed');
SELECT is(billguard.vault_reconcile((SELECT key_id FROM k3), 'j2', 1, 'absent', NULL, NULL, NULL, 'nothing'),
          'stale', 'an absence seen before attempt 2 proves nothing about it: stale');
SELECT is(billguard.vault_reconcile((SELECT key_id FROM k3), 'j2', 2, 'uncertain', NULL, NULL, NULL, 'search lags'),
          'unknown', 'uncertain: nothing changes');
SELECT is(billguard.vault_reconcile((SELECT key_id FROM k3), 'j2', 2, 'absent', NULL, NULL, NULL, 'not at Stripe'),
          'released', 'absent: released');
SELECT is((SELECT settled_cents || '/' || reserved_cents FROM billguard.vault_spend WHERE billing_period = '2041-03'),
          '1000/0', '... and no longer counted');
SELECT is(pg_temp.decision((SELECT vault_key FROM k3), 'POST', '/v1/payment_intents', 'j3', 'a', 1000), 'reserved', 'j3 reserved');
SELECT is(billguard.vault_reconcile((SELECT key_id FROM k3), 'j3', 1, 'found', 'pi_j3', '{"id": "pi_j3"}', 'req_j3', 'found by search'),
          'settled', 'found: settled');
SELECT results_eq($$SELECT decision, http_status, body, request_id
                      FROM pg_temp.authorize((SELECT vault_key FROM k3), 'POST', '/v1/payment_intents', 'j3', 'a', 1000)$$,
                  $$VALUES ('replayed'::text, 200, '{"id": "pi_j3"}'::text, 'req_j3'::text)$$,
                  '... and the object found is replayed');
SELECT is((SELECT reason FROM billguard.vault_audit WHERE idempotency_key = 'j3' AND decision = 'settled'),
          'reconciled with Stripe: found by search', '... audited with what was found');
SELECT throws_ok($$SELECT billguard.vault_reconcile((SELECT key_id FROM k3), 'j3', 1, 'maybe', NULL, NULL, NULL, NULL)$$,
                 '22023', NULL, 'a finding that is not found, absent or uncertain is 22023');

-- Bad arguments change nothing.
SELECT throws_ok($$SELECT * FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i3', 'a', 0)$$,
                 '22023', NULL, 'an amount of 0 is 22023');
SELECT throws_ok($$SELECT * FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents/../x', 'i3', 'a', 5)$$,
                 '22023', NULL, 'a path with .. is 22023');
SELECT throws_ok($$SELECT * FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i3', 'a', 5, 'usd', '25 hours')$$,
                 '22023', NULL, 'an idempotency window past Stripe''s 24 hours is 22023');

-- One audit row per decision.
SELECT is((SELECT string_agg(decision || coalesce(':' || http_status, ''), ' ' ORDER BY occurred_at)
             FROM billguard.vault_audit WHERE billing_period = '2041-01' AND decision <> 'issued'),
          'refused:403 refused:403 refused:403 refused:403 refused:403 forwarded refused:400 refused:400 '
          'reserved reused reused refused:400 refused:400 refused:429 reserved '
          'settled:200 settled:200 replayed:200 refused:429 refused:429 '
          'unknown:500 reused unknown:402 reused unknown:0 unknown:429 refused:429 released:402 released:402 '
          'reserved released:400 settled:200 refused:429 refused:429',
          'every decision of the budget is in vault_audit, in order');

SELECT * FROM finish();
ROLLBACK;
